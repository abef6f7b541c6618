//! The wait-time chart of the contention scenario (benches/results/waits.svg), written by hand.

use std::fmt::Write as _;

use crate::scenarios::contention::{Contention, Strategy};
use crate::stats::sorted;

/// Wait-time CDFs, one panel per worker count (8 and 32), one line per strategy, log x axis.
pub fn svg<'a>(find: impl Fn(Strategy, usize) -> Option<&'a Contention>) -> String {
    const PW: f64 = 520.0; // panel width
    const PH: f64 = 330.0; // panel height (plot area)
    const ML: f64 = 70.0; // left margin
    const MT: f64 = 90.0; // top margin (title + legend)
    const GAP: f64 = 90.0;
    const MB: f64 = 84.0;
    let panels = [8usize, 32];
    let width = ML + panels.len() as f64 * PW + (panels.len() - 1) as f64 * GAP + 30.0;
    let height = MT + PH + MB;
    let all: Vec<f64> = panels
        .iter()
        .flat_map(|w| Strategy::ALL.iter().filter_map(|st| find(*st, *w)))
        .flat_map(|c| c.waits.iter().copied())
        .collect();
    let lo_exp = -2i32; // 0.01 ms
    let max = all.iter().copied().fold(1.0, f64::max);
    let hi_exp = (max.log10().ceil() as i32).max(1);
    let xpos = |ms: f64, x0: f64| {
        let l = ms.max(10f64.powi(lo_exp)).log10();
        x0 + (l - lo_exp as f64) / (hi_exp - lo_exp) as f64 * PW
    };
    let mut o = String::new();
    let _ = writeln!(
        o,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0}" height="{height:.0}" viewBox="0 0 {width:.0} {height:.0}" font-family="DejaVu Sans, Helvetica, Arial, sans-serif" font-size="13">"#
    );
    let _ = writeln!(o, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        o,
        r#"<text x="{:.0}" y="24" font-size="17" font-weight="bold" text-anchor="middle">Wait for one contended lock (hold 1 ms): cumulative share of acquisitions</text>"#,
        width / 2.0
    );
    // Legend.
    let mut lx = ML;
    for st in Strategy::ALL {
        let _ = writeln!(
            o,
            r#"<line x1="{lx:.0}" y1="48" x2="{:.0}" y2="48" stroke="{}" {}/><text x="{:.0}" y="52">{}</text>"#,
            lx + 28.0,
            st.color(),
            st.stroke(),
            lx + 34.0,
            st.label()
        );
        lx += 34.0 + st.label().len() as f64 * 7.6 + 26.0;
    }
    for (pi, workers) in panels.iter().enumerate() {
        let x0 = ML + pi as f64 * (PW + GAP);
        let y0 = MT;
        let _ = writeln!(
            o,
            r#"<text x="{:.0}" y="{:.0}" font-size="15" font-weight="bold" text-anchor="middle">{workers} workers</text>"#,
            x0 + PW / 2.0,
            y0 - 10.0
        );
        let _ = writeln!(
            o,
            r##"<rect x="{x0:.0}" y="{y0:.0}" width="{PW:.0}" height="{PH:.0}" fill="none" stroke="#444"/>"##
        );
        for e in lo_exp..=hi_exp {
            let x = xpos(10f64.powi(e), x0);
            let label = match e {
                e if e < 0 => format!("{}", 10f64.powi(e)),
                e => format!("{}", 10i64.pow(e as u32)),
            };
            let _ = writeln!(
                o,
                r##"<line x1="{x:.1}" y1="{y0:.0}" x2="{x:.1}" y2="{:.0}" stroke="#ddd"/><text x="{x:.1}" y="{:.0}" text-anchor="middle">{label}</text>"##,
                y0 + PH,
                y0 + PH + 18.0
            );
        }
        for q in [0.0, 0.25, 0.5, 0.75, 1.0] {
            let y = y0 + PH - q * PH;
            let _ = writeln!(
                o,
                r##"<line x1="{x0:.0}" y1="{y:.1}" x2="{:.0}" y2="{y:.1}" stroke="#ddd"/><text x="{:.0}" y="{:.1}" text-anchor="end">{q}</text>"##,
                x0 + PW,
                x0 - 6.0,
                y + 4.0,
            );
        }
        let y99 = y0 + PH - 0.99 * PH;
        let _ = writeln!(
            o,
            r##"<line x1="{x0:.0}" y1="{y99:.1}" x2="{:.0}" y2="{y99:.1}" stroke="#999" stroke-dasharray="4 3"/><text x="{:.0}" y="{:.1}" text-anchor="end" font-size="11" fill="#666">p99</text>"##,
            x0 + PW,
            x0 + PW - 4.0,
            y99 + 13.0,
        );
        let _ = writeln!(
            o,
            r#"<text x="{:.0}" y="{:.0}" text-anchor="middle">wait until granted, ms (log scale)</text>"#,
            x0 + PW / 2.0,
            y0 + PH + 40.0
        );
        let _ = writeln!(
            o,
            r#"<text transform="translate({:.0},{:.0}) rotate(-90)" text-anchor="middle">share of acquisitions waiting at most x</text>"#,
            x0 - 46.0,
            y0 + PH / 2.0
        );
        // The lock's thick line goes under the dashed BLPOP line, which it mostly covers.
        for st in [
            Strategy::Backoff,
            Strategy::Retry1,
            Strategy::Retry10,
            Strategy::Block,
            Strategy::Blpop,
        ] {
            let Some(c) = find(st, *workers) else {
                continue;
            };
            let w = sorted(c.waits.clone());
            if w.is_empty() {
                continue;
            }
            let n = w.len();
            let steps = 400.min(n);
            let mut pts = String::new();
            let mut prev_y = y0 + PH;
            for k in 0..=steps {
                let idx = ((k as f64 / steps as f64) * (n - 1) as f64).round() as usize;
                let x = xpos(w[idx], x0);
                let y = y0 + PH - ((idx + 1) as f64 / n as f64) * PH;
                if k == 0 {
                    let _ = write!(pts, "{x:.1},{prev_y:.1} ");
                }
                let _ = write!(pts, "{x:.1},{prev_y:.1} {x:.1},{y:.1} ");
                prev_y = y;
            }
            let _ = writeln!(
                o,
                r#"<polyline fill="none" stroke="{}" {} stroke-linejoin="round" points="{}"/>"#,
                st.color(),
                st.stroke(),
                pts.trim_end()
            );
        }
    }
    let _ = writeln!(
        o,
        r##"<text x="{ML:.0}" y="{:.0}" font-size="12" fill="#555">Every acquisition of the whole run. The pollers' many near-zero waits are mostly a releasing worker taking its own lock again (not a handoff);</text>
<text x="{ML:.0}" y="{:.0}" font-size="12" fill="#555">a wait still going when a run ended (a starved poller) is not in the lines. Real handoffs per second and the rest: BENCHMARKS.md.</text>"##,
        height - 26.0,
        height - 10.0
    );
    o.push_str("</svg>\n");
    o
}
