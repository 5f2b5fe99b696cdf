//! The bundled GCP price table: on-demand and spot USD per hour of every machine type in every region,
//! from the community Karpenter provider for GCP's initial prices (2026-08-03, Apache-2.0), as
//! `providers/data/gcp-prices.csv`. A machine type the table does not price is offered without a price
//! and never launched; no price is ever guessed.

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
}
