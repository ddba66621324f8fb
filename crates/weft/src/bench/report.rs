//! What `weft bench` prints: summaries of a direction, the table, fio's JSON
//! layout for the fields it shares with fio, and the latency-under-load SVG.

use super::engine::Direction;
use std::fmt::Write;

/// Percentiles reported (fio's names: "99.000000").
const PERCENTILES: [f64; 7] = [1.0, 50.0, 90.0, 99.0, 99.9, 99.99, 100.0];

/// One direction of one run.
#[derive(Debug, Clone)]
pub struct Summary {
    pub ios: u64,
    pub iops: f64,
    pub bytes: u64,
    pub bytes_per_second: f64,
    pub mean_ns: f64,
    pub min_ns: u64,
    pub max_ns: u64,
    pub percentiles: Vec<(f64, u64)>,
}

impl Summary {
    /// None when the direction did no I/O.
    pub fn of(direction: &Direction, seconds: f64) -> Option<Summary> {
        let latency = &direction.latency;
        if latency.count() == 0 {
            return None;
        }
        let seconds = seconds.max(1e-9);
        Some(Summary {
            ios: latency.count(),
            iops: latency.count() as f64 / seconds,
            bytes: direction.bytes,
            bytes_per_second: direction.bytes as f64 / seconds,
            mean_ns: latency.mean_ns(),
            min_ns: latency.min_ns(),
            max_ns: latency.max_ns(),
            percentiles: PERCENTILES
                .iter()
                .map(|&p| (p, latency.percentile_ns(p)))
                .collect(),
        })
    }

    /// The latency at `percent` (one of the reported percentiles).
    pub fn at(&self, percent: f64) -> u64 {
        self.percentiles
            .iter()
            .find(|(p, _)| *p == percent)
            .map_or(0, |(_, ns)| *ns)
    }

    /// fio's per-direction object.
    pub fn fio_json(summary: Option<&Summary>) -> String {
        let Some(s) = summary else {
            return "{\"total_ios\":0,\"io_bytes\":0,\"iops\":0,\"bw_bytes\":0,\"lat_ns\":{\"min\":0,\"max\":0,\"mean\":0,\"percentile\":{}}}".to_string();
        };
        let percentiles: Vec<String> = s
            .percentiles
            .iter()
            .map(|(p, ns)| format!("\"{p:.6}\":{ns}"))
            .collect();
        format!(
            "{{\"total_ios\":{},\"io_bytes\":{},\"iops\":{:.3},\"bw_bytes\":{:.0},\"lat_ns\":{{\"min\":{},\"max\":{},\"mean\":{:.1},\"percentile\":{{{}}}}}}}",
            s.ios,
            s.bytes,
            s.iops,
            s.bytes_per_second,
            s.min_ns,
            s.max_ns,
            s.mean_ns,
            percentiles.join(",")
        )
    }
}

/// The column headings after a label column.
pub fn header(label: &str, width: usize) -> String {
    format!(
        "{label:<width$} {:>10} {:>9} {:>9} {:>9} {:>9} {:>9}",
        "IOPS", "MiB/s", "mean us", "p50 us", "p99 us", "p99.9 us"
    )
}

/// One row's numbers.
pub fn row(s: &Summary) -> String {
    format!(
        "{:>10.0} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>9.1}",
        s.iops,
        s.bytes_per_second / f64::from(1 << 20),
        s.mean_ns / 1000.0,
        s.at(50.0) as f64 / 1000.0,
        s.at(99.0) as f64 / 1000.0,
        s.at(99.9) as f64 / 1000.0
    )
}

/// One point of a sweep on the latency-under-load chart.
#[derive(Debug, Clone, Copy)]
pub struct Point {
    pub iodepth: usize,
    pub iops: f64,
    pub mean_us: f64,
    pub p99_us: f64,
}

/// Latency against IOPS over a sweep, one line per side, mean solid and
/// p99 dashed; each point labelled with its iodepth.
pub fn plot_svg(title: &str, series: &[(&str, Vec<Point>)]) -> String {
    const WIDTH: f64 = 760.0;
    const HEIGHT: f64 = 460.0;
    const LEFT: f64 = 70.0;
    const RIGHT: f64 = 150.0;
    const TOP: f64 = 40.0;
    const BOTTOM: f64 = 50.0;
    const COLOURS: [&str; 4] = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"];
    let points = series.iter().flat_map(|(_, points)| points);
    let iops_max = nice_ceiling(points.clone().map(|p| p.iops).fold(0.0, f64::max));
    let us_max = nice_ceiling(points.map(|p| p.p99_us.max(p.mean_us)).fold(0.0, f64::max));
    let plot_w = WIDTH - LEFT - RIGHT;
    let plot_h = HEIGHT - TOP - BOTTOM;
    let x = |iops: f64| LEFT + iops / iops_max * plot_w;
    let y = |us: f64| TOP + plot_h - us / us_max * plot_h;
    let mut svg = String::new();
    let _ = write!(
        svg,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{HEIGHT}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"{LEFT}\" y=\"22\" font-size=\"14\">{}</text>\n",
        escape(title)
    );
    for tick in 0..=5 {
        let fraction = f64::from(tick) / 5.0;
        let (tx, ty) = (x(fraction * iops_max), y(fraction * us_max));
        let _ = write!(
            svg,
            "<line x1=\"{LEFT}\" y1=\"{ty:.1}\" x2=\"{:.1}\" y2=\"{ty:.1}\" stroke=\"#ddd\"/>\n\
             <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{:.0}</text>\n\
             <line x1=\"{tx:.1}\" y1=\"{TOP}\" x2=\"{tx:.1}\" y2=\"{:.1}\" stroke=\"#eee\"/>\n\
             <text x=\"{tx:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{:.0}k</text>\n",
            LEFT + plot_w,
            LEFT - 6.0,
            ty + 4.0,
            fraction * us_max,
            TOP + plot_h,
            TOP + plot_h + 18.0,
            fraction * iops_max / 1000.0
        );
    }
    let _ = write!(
        svg,
        "<rect x=\"{LEFT}\" y=\"{TOP}\" width=\"{plot_w}\" height=\"{plot_h}\" fill=\"none\" stroke=\"black\"/>\n\
         <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">IOPS</text>\n\
         <text transform=\"translate(18 {:.1}) rotate(-90)\" text-anchor=\"middle\">latency (us)</text>\n",
        LEFT + plot_w / 2.0,
        HEIGHT - 10.0,
        TOP + plot_h / 2.0
    );
    for (index, (name, points)) in series.iter().enumerate() {
        let colour = COLOURS[index % COLOURS.len()];
        for (dash, pick) in [("", 0), (" stroke-dasharray=\"5 4\"", 1)] {
            let value = |p: &Point| if pick == 0 { p.mean_us } else { p.p99_us };
            let path: Vec<String> = points
                .iter()
                .map(|p| format!("{:.1},{:.1}", x(p.iops), y(value(p))))
                .collect();
            let _ = writeln!(
                svg,
                "<polyline points=\"{}\" fill=\"none\" stroke=\"{colour}\" stroke-width=\"2\"{dash}/>",
                path.join(" ")
            );
            for p in points {
                let _ = write!(
                    svg,
                    "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"3\" fill=\"{colour}\"/>",
                    x(p.iops),
                    y(value(p))
                );
                if pick == 0 {
                    let _ = write!(
                        svg,
                        "<text x=\"{:.1}\" y=\"{:.1}\" font-size=\"10\" fill=\"{colour}\">qd{}</text>",
                        x(p.iops) + 4.0,
                        y(value(p)) - 4.0,
                        p.iodepth
                    );
                }
            }
            svg.push('\n');
        }
        let ly = TOP + 10.0 + index as f64 * 36.0;
        let lx = LEFT + plot_w + 12.0;
        let _ = write!(
            svg,
            "<line x1=\"{lx}\" y1=\"{ly}\" x2=\"{:.1}\" y2=\"{ly}\" stroke=\"{colour}\" stroke-width=\"2\"/><text x=\"{:.1}\" y=\"{:.1}\">{} mean</text>\n\
             <line x1=\"{lx}\" y1=\"{:.1}\" x2=\"{:.1}\" y2=\"{:.1}\" stroke=\"{colour}\" stroke-width=\"2\" stroke-dasharray=\"5 4\"/><text x=\"{:.1}\" y=\"{:.1}\">{} p99</text>\n",
            lx + 24.0,
            lx + 30.0,
            ly + 4.0,
            escape(name),
            ly + 16.0,
            lx + 24.0,
            ly + 16.0,
            lx + 30.0,
            ly + 20.0,
            escape(name)
        );
    }
    svg.push_str("</svg>\n");
    svg
}

/// 1, 2 or 5 times a power of ten, at least `value` (and above zero).
fn nice_ceiling(value: f64) -> f64 {
    if value <= 0.0 {
        return 1.0;
    }
    let power = 10f64.powf(value.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * power)
        .find(|&v| v >= value)
        .unwrap_or(10.0 * power)
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plot_has_a_line_per_side_and_statistic() {
        let point = |iodepth, iops, mean_us| Point {
            iodepth,
            iops,
            mean_us,
            p99_us: mean_us * 2.0,
        };
        let svg = plot_svg(
            "randread <4k>",
            &[
                (
                    "local",
                    vec![point(1, 10_000.0, 90.0), point(32, 150_000.0, 200.0)],
                ),
                (
                    "remote",
                    vec![point(1, 9_000.0, 100.0), point(32, 140_000.0, 220.0)],
                ),
            ],
        );
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>\n"));
        assert_eq!(svg.matches("<polyline").count(), 4);
        assert!(svg.contains("qd32") && svg.contains("randread &lt;4k&gt;"));
        assert_eq!(nice_ceiling(440.0), 500.0);
        assert_eq!(nice_ceiling(150_000.0), 200_000.0);
    }
}
