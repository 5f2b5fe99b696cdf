//! The bundled GCP price table: on-demand and spot USD per hour of every machine type in every region,
//! from the community Karpenter provider for GCP's initial prices (2026-08-03, Apache-2.0), as
//! `providers/data/gcp-prices.csv`. A machine type the table does not price is offered without a price
//! and never launched; no price is ever guessed.
//!
//! A price file of one's own (`GcpSettings::price_file`, the same four columns) is laid over the bundled
//! table, row by row, and read again every `price_refresh`: newer prices, a negotiated discount, or the
//! hourly price of a GPU that N1 machines take attached (a row named after its accelerator type,
//! `nvidia-tesla-t4`), which the bundled table does not have. An N1 machine with GPUs attached is priced
//! as its machine plus its GPUs, and not at all when either is missing.

use std::collections::HashMap;

/// The bundled table.
pub const BUNDLED_PRICES_CSV: &str = include_str!("../../data/gcp-prices.csv");
/// The date of the bundled table.
pub const BUNDLED_PRICES_DATE: &str = "2026-08-03";

/// One machine type's hourly prices in a region.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Price {
    /// On-demand USD per hour.
    pub on_demand: f64,
    /// Spot USD per hour, when the table has one.
    pub spot: Option<f64>,
}

/// The prices of `region` in a `region,machine_type,on_demand_usd_per_hour,spot_usd_per_hour` table; an
/// error names the line. A row whose on-demand price is not a positive finite number is an error; an
/// empty or zero spot price is no spot price.
pub fn parse_prices(csv: &str, region: &str) -> Result<HashMap<String, Price>, String> {
    let mut out = HashMap::new();
    for (n, line) in csv.lines().enumerate().skip(1) {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let cols: Vec<&str> = line.split(',').collect();
        let [r, machine, od, spot] = cols[..] else {
            return Err(format!("line {}: expected 4 columns, got {}", n + 1, cols.len()));
        };
        if r != region {
            continue;
        }
        let on_demand: f64 = od
            .trim()
            .parse()
            .ok()
            .filter(|p: &f64| p.is_finite() && *p > 0.0)
            .ok_or_else(|| format!("line {}: on-demand price {od:?} is not a positive number", n + 1))?;
        let spot = spot.trim().parse::<f64>().ok().filter(|p| p.is_finite() && *p > 0.0);
        out.insert(machine.to_owned(), Price { on_demand, spot });
    }
    Ok(out)
}

/// The hourly price of instance type `name`: its machine type's, or for one with GPUs attached
/// (`n1-standard-16.4xnvidia-tesla-t4`) the machine's plus each GPU's; none when a part has no price.
/// Spot is priced only when every part has a spot price.
pub fn price_of(prices: &HashMap<String, Price>, name: &str) -> Option<Price> {
    let (machine, attached) = super::catalog::split_attached(name);
    let base = prices.get(machine).copied()?;
    let Some((count, model)) = attached else { return Some(base) };
    let gpu = prices.get(model).copied()?;
    let n = count as f64;
    Some(Price { on_demand: base.on_demand + n * gpu.on_demand, spot: base.spot.zip(gpu.spot).map(|(m, g)| m + n * g) })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn the_bundled_table_prices_gpu_machines_in_us_central1() {
        let p = parse_prices(BUNDLED_PRICES_CSV, "us-central1").unwrap();
        assert!(p.len() > 200, "{}", p.len());
        assert_eq!(p["g2-standard-24"].on_demand, 2.000832574);
        assert_eq!(p["a2-highgpu-1g"].spot, Some(1.92802));
        assert!(parse_prices(BUNDLED_PRICES_CSV, "mars-north1").unwrap().is_empty());
        let bad = "region,machine_type,on_demand_usd_per_hour,spot_usd_per_hour\nus-central1,x,free,\n";
        assert!(parse_prices(bad, "us-central1").unwrap_err().contains("line 2"));
    }

    /// An N1 machine with GPUs attached costs its machine plus its GPUs, when both are priced; the
    /// bundled table prices no attachable GPU, so without a price file of one's own it has no price.
    #[test]
    fn attached_gpus_are_priced_from_their_own_rows_or_not_at_all() {
        let mut p = parse_prices(BUNDLED_PRICES_CSV, "us-central1").unwrap();
        let machine = p["n1-standard-16"];
        assert_eq!(price_of(&p, "n1-standard-16"), Some(machine));
        assert_eq!(price_of(&p, "n1-standard-16.4xnvidia-tesla-t4"), None);
        // A price file's row for the GPU (a figure of the test's own, not a published price).
        let own = "region,machine_type,on_demand_usd_per_hour,spot_usd_per_hour\nus-central1,nvidia-tesla-t4,0.5,\n";
        p.extend(parse_prices(own, "us-central1").unwrap());
        let priced = price_of(&p, "n1-standard-16.4xnvidia-tesla-t4").unwrap();
        assert!((priced.on_demand - (machine.on_demand + 2.0)).abs() < 1e-9);
        assert_eq!(priced.spot, None, "the GPU has no spot price");
    }
}
