//! Prices: spot from `DescribeSpotPriceHistory`, on-demand from the bundled table or a price file.

use std::collections::HashMap;
use std::sync::Arc;

use aws_sdk_ec2::types as ec2;
use tenon_core::cloud::CloudError;

use super::catalog;
use super::errors::sdk_error;
use super::provider::{AwsProvider, Cached, NAME};

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

    /// On-demand prices of the region: the bundled table, or `on_demand_price_file` re-read every
    /// `price_refresh` (the previous table is kept when a re-read fails).
    pub(super) fn on_demand_prices(&self) -> Result<Arc<HashMap<String, f64>>, CloudError> {
        if let Some(p) = self.fresh(&self.state().on_demand, self.settings.price_refresh) {
            return Ok(p);
        }
        let loaded = match &self.settings.on_demand_price_file {
            Some(path) => std::fs::read_to_string(path)
                .map_err(|e| format!("on-demand price file {path}: {e}"))
                .and_then(|text| catalog::parse_prices(&text, &self.region).map_err(|e| format!("{path}: {e}"))),
            None => catalog::parse_prices(catalog::BUNDLED_PRICES_CSV, &self.region),
        };
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
}

/// A `SpotPrice` as a price: a finite, non-negative number, or nothing.
fn spot_price(text: &str) -> Option<f64> {
    text.trim().parse::<f64>().ok().filter(|p| p.is_finite() && *p >= 0.0)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    #[test]
    fn spot_prices_must_be_finite_and_non_negative() {
        assert_eq!(spot_price("0.4589"), Some(0.4589));
        assert_eq!(spot_price(" 0 "), Some(0.0));
        for bad in ["nan", "NaN", "inf", "-inf", "-0.1", "1e999", "cheap", ""] {
            assert_eq!(spot_price(bad), None, "{bad}");
        }
    }
}
