//! The self-contained HTML report of a simulation: charts drawn as inline SVG, no scripts, no network.

use std::fmt::Write as _;

use std::collections::BTreeMap;

use tenon_core::sim::scenario::{Report, Sample};

fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// One line of a chart: its legend, colour and points of (hour, value).
struct Series<'a> {
    name: &'a str,
    colour: &'a str,
    points: Vec<(f64, f64)>,
}

const COLOURS: [&str; 8] = ["#2563eb", "#f59e0b", "#10b981", "#ef4444", "#8b5cf6", "#0891b2", "#db2777", "#65a30d"];

/// The series of a per-key count over the timeline, one per key, the `most` largest by peak.
fn count_series<'a>(r: &'a Report, most: usize, pick: fn(&Sample) -> &BTreeMap<String, u32>) -> Vec<Series<'a>> {
    let mut peak: BTreeMap<&str, u32> = BTreeMap::new();
    for s in &r.timeline {
        for (k, n) in pick(s) {
            let p = peak.entry(k.as_str()).or_default();
            *p = (*p).max(*n);
        }
    }
    let mut keys: Vec<(&str, u32)> = peak.into_iter().collect();
    keys.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    keys.truncate(most);
    keys.iter()
        .enumerate()
        .map(|(i, (k, _))| Series {
            name: k,
            colour: COLOURS[i % COLOURS.len()],
            points: r.timeline.iter().map(|s| (s.hour, f64::from(pick(s).get(*k).copied().unwrap_or(0)))).collect(),
        })
        .collect()
}

/// The smallest of 1, 2, 4, 5, 8 or 10 times a power of ten at or above `v`: quarter ticks stay round.
fn nice_ceiling(v: f64) -> f64 {
    if v <= 0.0 {
        return 1.0;
    }
    let base = 10f64.powf(v.log10().floor());
    [1.0, 2.0, 4.0, 5.0, 8.0, 10.0].iter().map(|m| m * base).find(|c| *c >= v).unwrap_or(10.0 * base)
}

/// A tick label without trailing zeros.
fn tick(v: f64) -> String {
    let s = format!("{v:.2}");
    s.trim_end_matches('0').trim_end_matches('.').to_owned()
}

/// A line chart of `series` over `[0, x_max]` hours.
fn chart(title: &str, unit: &str, x_max: f64, series: &[Series<'_>]) -> String {
    let (w, h, pad) = (760.0, 220.0, 40.0);
    let y_max = nice_ceiling(series.iter().flat_map(|s| s.points.iter().map(|p| p.1)).fold(0.0_f64, f64::max));
    let sx = |x: f64| pad + (x / x_max.max(1e-9)) * (w - 2.0 * pad);
    let sy = |y: f64| h - pad + 10.0 - (y / y_max) * (h - 2.0 * pad);
    let mut svg = format!(
        "<figure><figcaption>{}</figcaption><svg viewBox=\"0 0 {w} {h}\" width=\"{w}\" height=\"{h}\" role=\"img\" aria-label=\"{}\">",
        esc(title),
        esc(title)
    );
    let _ = write!(svg, "<line x1=\"{pad}\" y1=\"{0}\" x2=\"{1}\" y2=\"{0}\" class=\"axis\"/>", sy(0.0), w - pad);
    let _ = write!(svg, "<line x1=\"{pad}\" y1=\"{}\" x2=\"{pad}\" y2=\"{}\" class=\"axis\"/>", sy(0.0), sy(y_max));
    for i in 0..=4 {
        let y = y_max * f64::from(i) / 4.0;
        let _ = write!(
            svg,
            "<text x=\"{}\" y=\"{}\" class=\"tick\" text-anchor=\"end\">{}{unit}</text>",
            pad - 4.0,
            sy(y) + 4.0,
            tick(y)
        );
    }
    for i in 0..=6 {
        let x = x_max * f64::from(i) / 6.0;
        let _ =
            write!(svg, "<text x=\"{}\" y=\"{}\" class=\"tick\" text-anchor=\"middle\">{x:.0}h</text>", sx(x), h - 8.0);
    }
    for (k, Series { name, colour, points }) in series.iter().enumerate() {
        let path: Vec<String> = points.iter().map(|(x, y)| format!("{:.1},{:.1}", sx(*x), sy(*y))).collect();
        let _ = write!(
            svg,
            "<polyline points=\"{}\" fill=\"none\" stroke=\"{colour}\" stroke-width=\"2\"/>",
            path.join(" ")
        );
        let lx = pad + 10.0 + 110.0 * k as f64;
        let _ = write!(
            svg,
            "<rect x=\"{lx}\" y=\"6\" width=\"12\" height=\"12\" fill=\"{colour}\"/><text x=\"{}\" y=\"16\" class=\"legend\">{}</text>",
            lx + 16.0,
            esc(name)
        );
    }
    svg.push_str("</svg></figure>");
    svg
}

/// Renders the report as one HTML page.
pub fn html(r: &Report) -> String {
    let x_max = r.hours;
    let mut cumulative = Vec::new();
    let mut rate = Vec::new();
    let mut acc = 0.0;
    let mut last = 0.0;
    for s in &r.timeline {
        acc += s.cost_per_hour * (s.hour - last);
        last = s.hour;
        cumulative.push((s.hour, acc));
        rate.push((s.hour, s.cost_per_hour));
    }
    let pending: Vec<(f64, f64)> = r.timeline.iter().map(|s| (s.hour, f64::from(s.pending))).collect();
    let mut out = String::new();
    let _ = write!(
        out,
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>tenon simulation: {}</title><style>\
body{{font-family:system-ui,sans-serif;margin:2rem;color:#111;max-width:900px}}h1{{font-size:1.4rem}}\
table{{border-collapse:collapse;margin:1rem 0}}td,th{{border:1px solid #ddd;padding:4px 8px;text-align:left;font-size:.9rem}}\
.axis{{stroke:#999}}.tick,.legend{{font-size:11px;fill:#444}}figure{{margin:1.5rem 0}}figcaption{{font-weight:600;margin-bottom:.3rem}}\
.kpi{{display:inline-block;margin:0 1.5rem 1rem 0}}.kpi b{{display:block;font-size:1.3rem}}</style></head><body>",
        esc(&r.scenario)
    );
    let _ = write!(out, "<h1>Scenario {} — {:.1} hours simulated</h1>", esc(&r.scenario), r.hours);
    let t = &r.time_to_schedule_seconds;
    for (label, value) in [
        ("total cost", format!("${:.2}", r.total_cost)),
        ("node-hours", format!("{:.1}", r.node_hours)),
        ("time to schedule p50 / p95 / max", format!("{:.0}s / {:.0}s / {:.0}s", t.p50, t.p95, t.max)),
        ("launches (failed, deferred)", format!("{} ({}, {})", r.launches, r.launch_failures, r.launch_deferrals)),
        ("pods evicted", r.pods_evicted.to_string()),
    ] {
        let _ = write!(out, "<div class=\"kpi\">{label}<b>{}</b></div>", esc(&value));
    }
    out.push_str("<table><tr><th>capacity type</th><th>cost per hour</th></tr>");
    for (ct, c) in &r.cost_per_hour_by_capacity_type {
        let _ = write!(out, "<tr><td>{}</td><td>${c:.2}</td></tr>", esc(ct));
    }
    out.push_str("</table><table><tr><th>disruption method</th><th>nodes disrupted</th></tr>");
    for (m, n) in &r.disruptions {
        let _ = write!(out, "<tr><td>{}</td><td>{n}</td></tr>", esc(m));
    }
    out.push_str("</table>");
    let one = |name, colour, points| [Series { name, colour, points }];
    out.push_str(&chart("Cumulative cost (USD)", "", x_max, &one("cost", COLOURS[0], cumulative)));
    out.push_str(&chart("Fleet cost per hour (USD)", "", x_max, &one("$/h", COLOURS[2], rate)));
    out.push_str(&chart("Nodes by capacity type", "", x_max, &count_series(r, 8, |s| &s.nodes)));
    out.push_str(&chart(
        "Nodes by instance type (largest six)",
        "",
        x_max,
        &count_series(r, 6, |s| &s.nodes_by_instance_type),
    ));
    out.push_str(&chart("Pending pods", "", x_max, &one("pending", COLOURS[3], pending)));
    out.push_str("<h2>Decisions</h2><table><tr><th>hour</th><th>decision</th></tr>");
    for d in &r.decisions {
        let _ = write!(out, "<tr><td>{:.2}</td><td>{}</td></tr>", d.hour, esc(&d.what));
    }
    out.push_str("</table></body></html>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::{nice_ceiling, tick};

    #[test]
    fn axes_end_on_round_numbers() {
        assert_eq!(nice_ceiling(0.0), 1.0);
        assert_eq!(nice_ceiling(2.0), 2.0);
        assert_eq!(nice_ceiling(15.0), 20.0);
        assert_eq!(nice_ceiling(289.27), 400.0);
        assert_eq!(nice_ceiling(0.03), 0.04);
        assert_eq!(tick(400.0 / 4.0), "100");
        assert_eq!(tick(2.5), "2.5");
        assert_eq!(tick(0.01), "0.01");
    }
}
