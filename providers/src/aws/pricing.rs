//! Prices: spot from `DescribeSpotPriceHistory`; on-demand from the Pricing API (`GetProducts`) over the
//! bundled table, or from a price file.

use std::collections::HashMap;
use std::sync::Arc;

use aws_sdk_ec2::types as ec2;
use tenon_core::cloud::CloudError;

use super::catalog;
use super::errors::sdk_error;
use super::provider::{AwsProvider, Cached, NAME};
use tenon_core::clock;

impl AwsProvider {
    /// The latest spot price of each (type, zone), from `DescribeSpotPriceHistory` (kept for
    /// `offerings_ttl`; the previous prices are kept when a refresh fails).
    pub(super) async fn spot_prices(&self) -> Result<Arc<HashMap<(String, String), f64>>, CloudError> {
        if let Some(p) = self.fresh(&self.state().spot, self.settings.offerings_ttl) {
            return Ok(p);
        }
        match self.fetch_spot_prices().await {
            Ok(value) => {
                let value = Arc::new(value);
                self.state().spot = Some(Cached { at: self.now(), value: value.clone() });
                Ok(value)
            }
            Err(e) => match self.state().spot.as_ref() {
                Some(old) => {
                    tracing::warn!(error = %e, "spot price refresh failed; keeping the previous prices");
                    Ok(old.value.clone())
                }
                None => Err(e),
            },
        }
    }

    pub(super) async fn fetch_spot_prices(&self) -> Result<HashMap<(String, String), f64>, CloudError> {
        let names = self.selected_names().await?;
        let mut latest: HashMap<(String, String), (i64, f64)> = HashMap::new();
        let start = aws_smithy_types::DateTime::from_secs(self.now().as_second());
        let mut req = self
            .ec2
            .describe_spot_price_history()
            .product_descriptions("Linux/UNIX")
            .product_descriptions("Linux/UNIX (Amazon VPC)")
            .start_time(start)
            .max_results(1000);
        if let Some(names) = &names {
            req = req.set_instance_types(Some(names.iter().map(|n| ec2::InstanceType::from(n.as_str())).collect()));
        }
        let mut pages = req.into_paginator().send();
        while let Some(page) = pages.next().await {
            let resp = page.map_err(|e| sdk_error("DescribeSpotPriceHistory", e))?;
            for p in resp.spot_price_history() {
                let (Some(t), Some(zone), Some(price)) = (p.instance_type(), p.availability_zone(), p.spot_price())
                else {
                    continue;
                };
                // A price that is not a finite, non-negative number (NaN, inf) would poison every comparison:
                // that offering goes unpriced (and so unoffered) rather than failing the whole refresh.
                let Some(price) = spot_price(price) else {
                    tracing::warn!(
                        instance_type = t.as_str(),
                        zone,
                        price,
                        "ignoring a spot price that is not a finite non-negative number"
                    );
                    continue;
                };
                let at = p.timestamp().map(|t| t.secs()).unwrap_or_default();
                let slot = latest.entry((t.as_str().to_owned(), zone.to_owned())).or_insert((at, price));
                if at >= slot.0 {
                    *slot = (at, price);
                }
            }
        }
        Ok(latest.into_iter().map(|(k, (_, p))| (k, p)).collect())
    }

    /// The on-demand prices of the region, each source refreshed as it falls due:
    /// - with `on_demand_price_file`, that file alone, read again every `price_refresh`;
    /// - otherwise the Pricing API's (`GetProducts`) every `price_refresh`, laid over the bundled table.
    ///   The bundled table (us-east-1's) is all a region has before the first answer, in an isolated VPC
    ///   (`isolated_vpc`) and in GovCloud, where the Pricing API is not served.
    ///
    /// A refresh that fails keeps the prices known, and is tried again after [`PRICING_RETRY`].
    pub(super) async fn on_demand_prices(&self) -> Result<Arc<HashMap<String, f64>>, CloudError> {
        if let Some(path) = self.settings.on_demand_price_file.clone() {
            return self.file_prices(&path);
        }
        let now = self.now();
        let (known, due) = {
            let st = self.state();
            (st.on_demand.as_ref().map(|c| c.value.clone()), st.pricing_due.is_none_or(|d| d <= now))
        };
        let known = match known {
            Some(k) => k,
            None => {
                let bundled = Arc::new(self.bundled_prices()?);
                self.state().on_demand = Some(Cached { at: now, value: bundled.clone() });
                bundled
            }
        };
        if !due || !self.pricing_api_served() {
            return Ok(known);
        }
        // Set before asking, so callers meanwhile use the prices known instead of asking too.
        self.state().pricing_due = Some(clock::add(now, PRICING_RETRY));
        match self.fetch_on_demand_prices().await {
            Ok(fresh) => {
                let count = fresh.len();
                let mut merged = HashMap::clone(&known);
                merged.extend(fresh);
                let merged = Arc::new(merged);
                let mut st = self.state();
                st.on_demand = Some(Cached { at: now, value: merged.clone() });
                st.pricing_due = Some(clock::add(now, self.settings.price_refresh));
                tracing::debug!(region = %self.region, instance_types = count, "on-demand prices read from the Pricing API");
                Ok(merged)
            }
            Err(e) => {
                tracing::warn!(region = %self.region, error = %e, "the Pricing API did not answer; keeping the on-demand prices known");
                Ok(known)
            }
        }
    }

    /// The on-demand prices known now, without asking anything (what listed instances are priced at).
    pub(super) fn known_on_demand_prices(&self) -> Option<Arc<HashMap<String, f64>>> {
        if let Some(known) = self.state().on_demand.as_ref() {
            return Some(known.value.clone());
        }
        match &self.settings.on_demand_price_file {
            Some(path) => self.file_prices(path).ok(),
            None => self.bundled_prices().ok().map(Arc::new),
        }
    }

    /// Whether this region can ask the Pricing API: not from an isolated VPC, and not in GovCloud (whose
    /// credentials the commercial Pricing API does not take).
    fn pricing_api_served(&self) -> bool {
        !self.settings.isolated_vpc && !self.region.starts_with("us-gov-")
    }

    fn bundled_prices(&self) -> Result<HashMap<String, f64>, CloudError> {
        catalog::parse_prices(catalog::BUNDLED_PRICES_CSV, &self.region).map_err(|e| CloudError::message(NAME, e))
    }

    /// `on_demand_price_file`'s prices, read again every `price_refresh` (the previous ones are kept when a
    /// read fails).
    fn file_prices(&self, path: &str) -> Result<Arc<HashMap<String, f64>>, CloudError> {
        if let Some(p) = self.fresh(&self.state().on_demand, self.settings.price_refresh) {
            return Ok(p);
        }
        let loaded = std::fs::read_to_string(path)
            .map_err(|e| format!("on-demand price file {path}: {e}"))
            .and_then(|text| catalog::parse_prices(&text, &self.region).map_err(|e| format!("{path}: {e}")));
        let value = match loaded {
            Ok(v) => Arc::new(v),
            Err(e) => match self.state().on_demand.as_ref() {
                Some(old) => {
                    tracing::warn!(error = %e, "on-demand price refresh failed; keeping the previous prices");
                    old.value.clone()
                }
                None => return Err(CloudError::message(NAME, e)),
            },
        };
        self.state().on_demand = Some(Cached { at: self.now(), value: value.clone() });
        Ok(value)
    }

    /// Every Linux on-demand price of the region from the Pricing API, as Karpenter asks for them: shared
    /// tenancy compute instances, then bare metal (listed under dedicated tenancy). Either query answering
    /// nothing is an error, so a half answer never replaces what is known.
    async fn fetch_on_demand_prices(&self) -> Result<HashMap<String, f64>, CloudError> {
        let mut out = HashMap::new();
        for (tenancy, family) in [("Shared", "Compute Instance"), ("Dedicated", "Compute Instance (bare metal)")] {
            let prices = self.get_products(tenancy, family).await?;
            if prices.is_empty() {
                return Err(CloudError::message(
                    NAME,
                    format!("GetProducts: no {family:?} prices for region {}", self.region),
                ));
            }
            out.extend(prices);
        }
        Ok(out)
    }

    async fn get_products(&self, tenancy: &str, family: &str) -> Result<HashMap<String, f64>, CloudError> {
        use aws_sdk_pricing::types::{Filter, FilterType};
        let mut req = self.pricing.get_products().service_code("AmazonEC2").max_results(100);
        for (field, value) in [
            ("regionCode", self.region.as_str()),
            ("serviceCode", "AmazonEC2"),
            ("preInstalledSw", "NA"),
            ("operatingSystem", "Linux"),
            ("capacitystatus", "Used"),
            ("marketoption", "OnDemand"),
            ("tenancy", tenancy),
            ("productFamily", family),
        ] {
            let filter = Filter::builder()
                .r#type(FilterType::TermMatch)
                .field(field)
                .value(value)
                .build()
                .map_err(|e| CloudError::message(NAME, format!("GetProducts filter {field}: {e}")))?;
            req = req.filters(filter);
        }
        // China's regions are priced in yuan; prices only ever compare within one region.
        let currency = if self.region.starts_with("cn-") { "CNY" } else { "USD" };
        let mut out = HashMap::new();
        let mut pages = req.into_paginator().send();
        while let Some(page) = pages.next().await {
            let page = page.map_err(|e| sdk_error("GetProducts", e))?;
            for item in page.price_list() {
                match price_of_item(item, currency) {
                    Ok(Some((instance_type, price))) => {
                        out.insert(instance_type, price);
                    }
                    Ok(None) => {}
                    Err(e) => tracing::warn!(error = %e, "skipping a Pricing API product that cannot be read"),
                }
            }
        }
        Ok(out)
    }
}

/// How soon a Pricing API refresh that failed is tried again.
pub(super) const PRICING_RETRY: std::time::Duration = std::time::Duration::from_secs(5 * 60);

/// The region whose Pricing API endpoint `region` asks (the API is served from a few regions only).
pub(super) fn pricing_region(region: &str) -> &'static str {
    if region.starts_with("ap-") {
        "ap-south-1"
    } else if region.starts_with("cn-") {
        "cn-northwest-1"
    } else if region.starts_with("eu-") {
        "eu-central-1"
    } else {
        "us-east-1"
    }
}

/// The part of a Pricing API product (one `PriceList` entry, a JSON document) a price is read from.
#[derive(serde::Deserialize)]
struct PriceItem {
    product: Product,
    #[serde(default)]
    terms: Terms,
}

#[derive(serde::Deserialize)]
struct Product {
    #[serde(default)]
    attributes: HashMap<String, String>,
}

#[derive(serde::Deserialize, Default)]
struct Terms {
    #[serde(rename = "OnDemand", default)]
    on_demand: HashMap<String, Term>,
}

#[derive(serde::Deserialize)]
struct Term {
    #[serde(rename = "priceDimensions", default)]
    price_dimensions: HashMap<String, Dimension>,
}

#[derive(serde::Deserialize)]
struct Dimension {
    #[serde(rename = "pricePerUnit", default)]
    price_per_unit: HashMap<String, String>,
}

/// The instance type and hourly on-demand price of one `PriceList` entry; `None` for a product without an
/// instance type or a positive price in `currency` (a product with several carries its last, as
/// Karpenter reads it).
fn price_of_item(json: &str, currency: &str) -> Result<Option<(String, f64)>, String> {
    let item: PriceItem = serde_json::from_str(json).map_err(|e| format!("PriceList entry: {e}"))?;
    let Some(instance_type) = item.product.attributes.get("instanceType").filter(|t| !t.is_empty()) else {
        return Ok(None);
    };
    let price = item
        .terms
        .on_demand
        .values()
        .flat_map(|t| t.price_dimensions.values())
        .filter_map(|d| d.price_per_unit.get(currency)?.trim().parse::<f64>().ok())
        .filter(|p| p.is_finite() && *p > 0.0)
        .last();
    Ok(price.map(|p| (instance_type.clone(), p)))
}

/// A `SpotPrice` as a price: a finite, non-negative number, or nothing.
fn spot_price(text: &str) -> Option<f64> {
    text.trim().parse::<f64>().ok().filter(|p| p.is_finite() && *p >= 0.0)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    /// A `PriceList` entry as the Pricing API documents it (trimmed to what is read, with the SKU keys
    /// that nest its terms).
    fn item(instance_type: &str, usd: &str) -> String {
        serde_json::json!({
            "product": {"productFamily": "Compute Instance", "sku": "ABC",
                "attributes": {"instanceType": instance_type, "regionCode": "eu-west-1", "tenancy": "Shared"}},
            "serviceCode": "AmazonEC2",
            "terms": {"OnDemand": {"ABC.JRTCKXETXF": {"sku": "ABC", "offerTermCode": "JRTCKXETXF",
                "priceDimensions": {"ABC.JRTCKXETXF.6YS6EN2CT7": {"unit": "Hrs", "pricePerUnit": {"USD": usd}}}}}},
            "version": "20260720000000", "publicationDate": "2026-07-20T00:00:00Z"
        })
        .to_string()
    }

    #[test]
    fn price_list_entries_give_their_type_and_hourly_price() {
        assert_eq!(price_of_item(&item("m5.large", "0.0960000000"), "USD").unwrap(), Some(("m5.large".into(), 0.096)));
        // No price in the currency, a zero price (a free tier line) or no instance type: nothing.
        assert_eq!(price_of_item(&item("m5.large", "0.0960000000"), "CNY").unwrap(), None);
        assert_eq!(price_of_item(&item("m5.large", "0.0000000000"), "USD").unwrap(), None);
        assert_eq!(price_of_item(&item("", "0.096"), "USD").unwrap(), None);
        assert!(price_of_item("{not json", "USD").is_err());
        assert_eq!(pricing_region("eu-west-1"), "eu-central-1");
        assert_eq!(pricing_region("ap-northeast-1"), "ap-south-1");
        assert_eq!(pricing_region("us-west-2"), "us-east-1");
        assert_eq!(pricing_region("cn-north-1"), "cn-northwest-1");
    }

    #[test]
    fn spot_prices_must_be_finite_and_non_negative() {
        assert_eq!(spot_price("0.4589"), Some(0.4589));
        assert_eq!(spot_price(" 0 "), Some(0.0));
        for bad in ["nan", "NaN", "inf", "-inf", "-0.1", "1e999", "cheap", ""] {
            assert_eq!(spot_price(bad), None, "{bad}");
        }
    }
}
