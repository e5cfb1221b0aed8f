//! Learning-curve PNGs, drawn with `plotters`' bitmap backend and a font embedded in the binary (no system fonts,
//! no fontconfig).

use crate::atomic;
use crate::error::{Error, Result};
use plotters::prelude::*;
use plotters::style::FontStyle;
use std::path::Path;
use std::sync::OnceLock;

const FONT: &str = "sans-serif";
const SIZE: (u32, u32) = (900, 540);

/// Registers the embedded font with plotters once per process.
fn font_registered() -> std::result::Result<(), String> {
    static REGISTERED: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    REGISTERED
        .get_or_init(|| {
            plotters::style::register_font(FONT, FontStyle::Normal, epaint_default_fonts::UBUNTU_LIGHT)
                .map_err(|_| "the embedded font does not parse".to_string())
        })
        .clone()
}

/// Draws mean return against env steps as a PNG at `path` (replaced atomically: temporary file, fsync, rename).
/// Points with a non-finite return are left out.
pub fn plot_curve(path: impl AsRef<Path>, points: &[(u64, f64)], title: &str) -> Result<()> {
    plot_curves(path, &[("", points)], title)
}

/// Draws several curves (one per policy, each `(label, points)`) on one chart, in distinct
/// colours with a legend of their labels (none when there is one curve), as [`plot_curve`] does.
pub fn plot_curves(path: impl AsRef<Path>, curves: &[(&str, &[(u64, f64)])], title: &str) -> Result<()> {
    let path = path.as_ref();
    let tmp = atomic::temp_path(path);
    let failed = |reason: String| Error::Plot {
        path: path.to_path_buf(),
        reason,
    };
    font_registered().map_err(failed)?;
    atomic::discard_on_error(&tmp, draw(&tmp, curves, title).map_err(failed))?;
    atomic::commit(&tmp, path)
}

/// Line colours, cycled through by curve.
const COLOURS: [RGBColor; 6] = [
    BLUE,
    RED,
    RGBColor(0, 150, 0),
    RGBColor(230, 140, 0),
    MAGENTA,
    RGBColor(0, 160, 170),
];

fn draw(to: &Path, curves: &[(&str, &[(u64, f64)])], title: &str) -> std::result::Result<(), String> {
    let series: Vec<Vec<(f64, f64)>> = curves
        .iter()
        .map(|(_, points)| {
            points
                .iter()
                .filter(|p| p.1.is_finite())
                .map(|&(x, y)| (x as f64, y))
                .collect()
        })
        .collect();
    let all = || series.iter().flatten();
    let x_max = all().map(|p| p.0).fold(1.0, f64::max);
    let (mut y_min, mut y_max) = all().fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), p| {
        (lo.min(p.1), hi.max(p.1))
    });
    if all().next().is_none() {
        (y_min, y_max) = (0.0, 1.0);
    }
    let pad = ((y_max - y_min) * 0.05).max(0.5);
    let e = |e: &dyn std::fmt::Display| e.to_string();

    let root = BitMapBackend::new(to, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(|x| e(&x))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, (FONT, 26))
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(72)
        .build_cartesian_2d(0.0..x_max, (y_min - pad)..(y_max + pad))
        .map_err(|x| e(&x))?;
    chart
        .configure_mesh()
        .x_desc("env steps")
        .y_desc("mean return")
        .x_label_formatter(&|x| format_steps(*x))
        .label_style((FONT, 16))
        .axis_desc_style((FONT, 18))
        .draw()
        .map_err(|x| e(&x))?;
    for (i, ((label, _), pts)) in curves.iter().zip(series).enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        let drawn = chart
            .draw_series(LineSeries::new(pts, colour.stroke_width(2)))
            .map_err(|x| e(&x))?;
        if curves.len() > 1 {
            drawn
                .label(*label)
                .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], colour.stroke_width(2)));
        }
    }
    if curves.len() > 1 {
        chart
            .configure_series_labels()
            .label_font((FONT, 16))
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()
            .map_err(|x| e(&x))?;
    }
    root.present().map_err(|x| e(&x))
}

/// `1500` → `1.5K`, `2000000` → `2M`.
fn format_steps(x: f64) -> String {
    let (v, unit) = match x.abs() {
        a if a >= 1e9 => (x / 1e9, "G"),
        a if a >= 1e6 => (x / 1e6, "M"),
        a if a >= 1e3 => (x / 1e3, "K"),
        _ => (x, ""),
    };
    let s = format!("{v:.2}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    format!("{s}{unit}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    #[test]
    fn writes_a_png_atomically() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("learning_curve_p0.png");
        let pts: Vec<(u64, f64)> = (0..60)
            .map(|i| (i * 2500, 500.0 * (1.0 - (-(i as f64) / 15.0).exp())))
            .chain([(150_000, f64::NAN)])
            .collect();
        plot_curve(&path, &pts, "CartPole-v1").unwrap();
        plot_curve(&path, &pts[..30], "CartPole-v1").unwrap();
        let bytes = fs::read(&path).unwrap();
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn empty_and_flat_curves_still_draw() {
        let dir = tempfile::tempdir().unwrap();
        plot_curve(dir.path().join("a.png"), &[], "empty").unwrap();
        plot_curve(dir.path().join("b.png"), &[(0, 3.0), (10, 3.0)], "flat").unwrap();
    }

    #[test]
    fn several_curves_share_one_chart_with_a_legend() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("learning_curve.png");
        let rising: Vec<(u64, f64)> = (0..20).map(|i| (i * 1000, i as f64)).collect();
        let falling: Vec<(u64, f64)> = (0..10).map(|i| (i * 2000, 20.0 - i as f64)).collect();
        plot_curves(
            &path,
            &[("policy 0", &rising), ("policy 1", &falling), ("policy 2", &[])],
            "t",
        )
        .unwrap();
        let one = dir.path().join("one.png");
        plot_curve(&one, &rising, "t").unwrap();
        let (several, single) = (fs::read(&path).unwrap(), fs::read(&one).unwrap());
        assert_eq!(&several[..8], b"\x89PNG\r\n\x1a\n");
        assert_ne!(several, single, "the second curve and the legend are drawn");
    }

    #[test]
    fn unwritable_path_is_an_error_naming_it() {
        let err = plot_curve("/nonexistent-dir/c.png", &[(1, 1.0)], "t")
            .unwrap_err()
            .to_string();
        assert!(err.contains("/nonexistent-dir/c.png"), "{err}");
    }

    #[test]
    fn step_labels_are_short() {
        assert_eq!(format_steps(0.0), "0");
        assert_eq!(format_steps(1500.0), "1.5K");
        assert_eq!(format_steps(2_000_000.0), "2M");
        assert_eq!(format_steps(125_000.0), "125K");
    }
}
