//! Draws the side-by-side benchmark results of `bench/compare.sh
//! --json-out` as an SVG bar chart: tokens/s of llama.cpp and infer per
//! model and test.
//!
//! `cargo run --release -p infer-cli --example bench_chart -- OUT.svg RESULT.json...`

use plotters::prelude::*;
use serde_json::Value;

struct Bar {
    label: String,
    llama: f64,
    infer: f64,
}

fn load(path: &str) -> Result<Vec<Bar>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
    let doc: Value = serde_json::from_str(&text).map_err(|e| format!("{path}: {e}"))?;
    let model = doc["model"]["type"]
        .as_str()
        .map(str::to_string)
        .or_else(|| doc["model"]["path"].as_str().map(|p| p.rsplit('/').next().unwrap_or(p).to_string()))
        .unwrap_or_else(|| path.to_string());
    let threads = doc["params"]["threads"].as_u64().unwrap_or(0);
    let results = doc["results"].as_array().ok_or(format!("{path}: no results"))?;
    Ok(results
        .iter()
        .filter_map(|r| {
            Some(Bar {
                label: format!("{model} {} (t={threads})", r["test"].as_str()?),
                llama: r["llama_cpp_avg_ts"].as_f64()?,
                infer: r["infer_avg_ts"].as_f64()?,
            })
        })
        .collect())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() < 2 {
        return Err("usage: bench_chart OUT.svg RESULT.json...".into());
    }
    let mut bars = vec![];
    for p in &args[1..] {
        bars.extend(load(p)?);
    }
    if bars.is_empty() {
        return Err("no results with both engines' numbers".into());
    }
    // One panel per (model, test): prefill and decode rates differ by 10x,
    // so each gets its own scale.
    let n = bars.len();
    let root = SVGBackend::new(&args[0], (340 * n as u32, 420)).into_drawing_area();
    root.fill(&WHITE)?;
    let root = root.titled("tokens/s, llama.cpp vs infer (higher is better)", ("sans-serif", 20))?;
    let llama_color = RGBColor(120, 120, 120);
    let infer_color = RGBColor(31, 119, 180);
    for (panel, b) in root.split_evenly((1, n)).iter().zip(&bars) {
        let max = b.llama.max(b.infer) * 1.2;
        let mut chart = ChartBuilder::on(panel)
            .caption(format!("{} ({:.2}x)", b.label, b.infer / b.llama), ("sans-serif", 13))
            .margin(12)
            .x_label_area_size(25)
            .y_label_area_size(50)
            .build_cartesian_2d(0f64..2f64, 0f64..max)?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(3)
            .x_label_formatter(&|x| match x.round() as i64 {
                0 => "llama.cpp".into(),
                1 => "infer".into(),
                _ => String::new(),
            })
            .y_desc("tokens/s")
            .draw()?;
        let bars2 = [(0.0, b.llama, llama_color), (1.0, b.infer, infer_color)];
        chart
            .draw_series(bars2.iter().map(|&(x, v, c)| Rectangle::new([(x + 0.15, 0.0), (x + 0.85, v)], c.filled())))?;
        chart.draw_series(
            bars2
                .iter()
                .map(|&(x, v, _)| Text::new(format!("{v:.1}"), (x + 0.3, v * 1.03 + max * 0.02), ("sans-serif", 13))),
        )?;
    }
    root.present()?;
    eprintln!("wrote {}", args[0]);
    Ok(())
}
