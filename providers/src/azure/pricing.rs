//! Azure VM prices: the Retail Prices API, read for the region and refreshed, with the bundled on-demand
//! table as the fallback. No price is ever guessed: a size with no known price is offered without one
//! and never launched on price.
//!
//! The Retail Prices API (`GET https://prices.azure.com/api/retail/prices`, public, no credentials) is
//! asked for `serviceName eq 'Virtual Machines' and priceType eq 'Consumption' and currencyCode eq 'USD'
//! and armRegionName eq '<region>'`, and its pages followed (`NextPageLink`). Of its items:
//! - Windows (`productName` ending ` Windows`) and low-priority meters (`meterName` ending
//!   ` Low Priority`) are skipped, as are meters not billed by the hour;
//! - an item whose `skuName` ends ` Spot` is the size's spot price, any other its on-demand price;
//! - of several items for one size and kind, the one that took effect last wins.
//!
//! The bundled table (`providers/data/azure-on-demand-prices.csv`) is karpenter-provider-azure's
//! on-demand prices of 57 regions as generated on [`BUNDLED_PRICES_DATE`]; it has no spot prices, so
//! until the API has been read spot offerings have no price and are not offered.

use std::collections::HashMap;

use serde::Deserialize;

/// The bundled table: `region,vm_size,usd_per_hour`.
pub const BUNDLED_PRICES_CSV: &str = include_str!("../../data/azure-on-demand-prices.csv");
/// The date of the bundled table.
pub const BUNDLED_PRICES_DATE: &str = "2026-06-18";
/// The Retail Prices API.
pub const RETAIL_PRICES_ENDPOINT: &str = "https://prices.azure.com";
/// The API version asked of it.
pub const RETAIL_PRICES_API_VERSION: &str = "2023-01-01-preview";

/// One size's hourly prices.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Price {
    /// On-demand USD per hour, when known.
    pub on_demand: Option<f64>,
    /// Spot USD per hour, when known.
    pub spot: Option<f64>,
}

/// The bundled on-demand prices of `region`; an error names the line.
pub fn bundled(region: &str) -> Result<HashMap<String, Price>, String> {
    parse_table(BUNDLED_PRICES_CSV, region)
}

/// The on-demand prices of `region` in a `region,vm_size,usd_per_hour` table (a zero price is no price).
pub fn parse_table(csv: &str, region: &str) -> Result<HashMap<String, Price>, String> {
    let mut out = HashMap::new();
    for (n, line) in csv.lines().enumerate().skip(1) {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let mut cols = line.split(',');
        let (Some(r), Some(size), Some(price), None) = (cols.next(), cols.next(), cols.next(), cols.next()) else {
            return Err(format!("line {}: expected 3 columns", n + 1));
        };
        if r != region {
            continue;
        }
        let p: f64 = price
            .trim()
            .parse()
            .ok()
            .filter(|p: &f64| p.is_finite() && *p >= 0.0)
            .ok_or_else(|| format!("line {}: price {price:?} is not a number of dollars", n + 1))?;
        // A zero is a size the table does not price: it is left unpriced, not free.
        if p > 0.0 {
            out.insert(size.to_owned(), Price { on_demand: Some(p), spot: None });
        }
    }
    Ok(out)
}

/// The OData filter asked of the Retail Prices API for `region`.
pub fn retail_filter(region: &str) -> String {
    format!(
        "serviceName eq 'Virtual Machines' and priceType eq 'Consumption' and currencyCode eq 'USD' and armRegionName eq '{region}'"
    )
}

/// One page of the Retail Prices API.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct RetailPage {
    /// The page's items.
    #[serde(default)]
    pub items: Vec<RetailItem>,
    /// The next page, absent or null on the last.
    #[serde(default)]
    pub next_page_link: Option<String>,
}

/// One item (meter) of the Retail Prices API; only the fields read here.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RetailItem {
    /// The VM size (`Standard_D4s_v5`).
    #[serde(default)]
    pub arm_sku_name: String,
    /// USD per unit.
    pub retail_price: f64,
    /// `D4s v5`, `D4s v5 Spot`, `D4s v5 Low Priority`.
    #[serde(default)]
    pub sku_name: String,
    /// `Virtual Machines Dsv5 Series` or `… Series Windows`.
    #[serde(default)]
    pub product_name: String,
    /// `D4s v5`, `D4s v5 Spot`, `D4s v5 Low Priority`.
    #[serde(default)]
    pub meter_name: String,
    /// `1 Hour`.
    #[serde(default)]
    pub unit_of_measure: String,
    /// When the price took effect (RFC 3339).
    #[serde(default)]
    pub effective_start_date: String,
}

/// Which price an item is: `Some(true)` spot, `Some(false)` on-demand, `None` skipped.
pub fn item_kind(item: &RetailItem) -> Option<bool> {
    if item.arm_sku_name.is_empty()
        || item.product_name.ends_with(" Windows")
        || item.meter_name.ends_with(" Low Priority")
        || item.sku_name.ends_with(" Low Priority")
        || (!item.unit_of_measure.is_empty() && item.unit_of_measure != "1 Hour")
        || !(item.retail_price.is_finite() && item.retail_price > 0.0)
    {
        return None;
    }
    Some(item.sku_name.ends_with(" Spot"))
}

/// The prices the items say, by size.
pub fn from_items<'a>(items: impl IntoIterator<Item = &'a RetailItem>) -> HashMap<String, Price> {
    let mut latest: HashMap<(&str, bool), (&str, f64)> = HashMap::new();
    for item in items {
        let Some(spot) = item_kind(item) else { continue };
        let slot = latest
            .entry((item.arm_sku_name.as_str(), spot))
            .or_insert((item.effective_start_date.as_str(), item.retail_price));
        // RFC 3339 dates of one format order as text.
        if item.effective_start_date.as_str() > slot.0 {
            *slot = (item.effective_start_date.as_str(), item.retail_price);
        }
    }
    let mut out: HashMap<String, Price> = HashMap::new();
    for ((size, spot), (_, p)) in latest {
        let e = out.entry(size.to_owned()).or_default();
        if spot {
            e.spot = Some(p);
        } else {
            e.on_demand = Some(p);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn the_bundled_table_prices_eastus() {
        let p = bundled("eastus").unwrap();
        assert!(p.len() > 1000, "{}", p.len());
        assert_eq!(p["Standard_D4s_v5"].on_demand, Some(0.192));
        assert_eq!(p["Standard_D4s_v5"].spot, None);
        assert!(bundled("mars-north").unwrap().is_empty());
        assert!(parse_table("region,vm_size,usd_per_hour\neastus,x,free\n", "eastus").unwrap_err().contains("line 2"));
    }

    fn item(sku: &str, product: &str, meter: &str, price: f64, date: &str) -> RetailItem {
        RetailItem {
            arm_sku_name: "Standard_D4s_v5".into(),
            retail_price: price,
            sku_name: sku.into(),
            product_name: product.into(),
            meter_name: meter.into(),
            unit_of_measure: "1 Hour".into(),
            effective_start_date: date.into(),
        }
    }

    #[test]
    fn windows_and_low_priority_are_skipped_and_spot_is_told_apart() {
        let product = "Virtual Machines Dsv5 Series";
        let items = [
            item("D4s v5", product, "D4s v5", 0.192, "2024-01-01T00:00:00Z"),
            item("D4s v5", &format!("{product} Windows"), "D4s v5", 0.376, "2024-01-01T00:00:00Z"),
            item("D4s v5 Low Priority", product, "D4s v5 Low Priority", 0.0384, "2024-01-01T00:00:00Z"),
            item("D4s v5 Spot", product, "D4s v5 Spot", 0.0211, "2024-01-01T00:00:00Z"),
            item("D4s v5 Spot", product, "D4s v5 Spot", 0.0199, "2025-06-01T00:00:00Z"),
        ];
        let p = from_items(&items);
        assert_eq!(p["Standard_D4s_v5"], Price { on_demand: Some(0.192), spot: Some(0.0199) });
    }
}
