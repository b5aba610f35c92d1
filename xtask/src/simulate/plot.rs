//! Heatmap PNGs like seed 001's (`numpy.histogram2d` shown with `imshow`).
//!
//! Text is drawn with plotters' `ab_glyph` backend from DejaVu Sans compiled
//! into the binary (the `dejavu` crate), so a clean machine needs neither
//! fontconfig nor freetype nor any installed font.
use std::{path::Path, sync::Once};

use anyhow::{Result, anyhow};
use plotters::prelude::*;

const FONT: &str = "sans-serif";

fn register_font() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        for style in [FontStyle::Normal, FontStyle::Bold] {
            // The embedded font is a valid TTF; if it ever were not, labels
            // would be missing, which the PNG check in the tests would show.
            let _ = plotters::style::register_font(FONT, style, dejavu::sans::regular());
        }
    });
}

/// Counts of `points` in a `bins` × `bins` grid over `[0, x_max) × [0, y_max]`;
/// `grid[i][j]` is column `i` (x), row `j` (y). Points past the edges land in
/// the last bin.
#[must_use]
pub fn histogram2d(points: &[(f64, f64)], x_max: f64, y_max: f64, bins: usize) -> Vec<Vec<u64>> {
    let bin = |v: f64, max: f64| ((v / max * bins as f64).floor().max(0.0) as usize).min(bins - 1);
    let mut grid = vec![vec![0; bins]; bins];
    for &(x, y) in points {
        grid[bin(x, x_max)][bin(y, y_max)] += 1;
    }
    grid
}

/// Draws the heatmap of `points` (x = arrival minute, y = wait in seconds)
/// with a colour bar, and writes it as a PNG.
pub fn heatmap(
    path: &Path,
    title: &str,
    points: &[(f64, f64)],
    x_max: f64,
    y_max: f64,
    bins: usize,
) -> Result<()> {
    register_font();
    let grid = histogram2d(points, x_max, y_max, bins);
    let peak = grid.iter().flatten().copied().max().unwrap_or(0).max(1);
    let err = |e: DrawingAreaErrorKind<_>| anyhow!("drawing {}: {e:?}", path.display());

    let root = BitMapBackend::new(path, (960, 720)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let (main, side) = root.split_horizontally(840);

    let mut chart = ChartBuilder::on(&main)
        .caption(title, (FONT, 20))
        .margin(12)
        .x_label_area_size(48)
        .y_label_area_size(64)
        .build_cartesian_2d(0.0..x_max, 0.0..y_max)
        .map_err(err)?;
    chart
        .configure_mesh()
        .disable_mesh()
        .x_desc("arrival minute (bucket)")
        .y_desc("wait (seconds)")
        .x_label_formatter(&|v| format!("{v:.0}"))
        .y_label_formatter(&|v| format!("{v:.0}"))
        .axis_desc_style((FONT, 16))
        .label_style((FONT, 13))
        .draw()
        .map_err(err)?;
    let (dx, dy) = (x_max / bins as f64, y_max / bins as f64);
    chart
        .draw_series(grid.iter().enumerate().flat_map(|(i, column)| {
            column.iter().enumerate().map(move |(j, &n)| {
                let colour = ViridisRGB::get_color_normalized(n as f64, 0.0, peak as f64);
                Rectangle::new(
                    [
                        (i as f64 * dx, j as f64 * dy),
                        ((i + 1) as f64 * dx, (j + 1) as f64 * dy),
                    ],
                    colour.filled(),
                )
            })
        }))
        .map_err(err)?;

    // Colour bar: visitors per cell.
    let mut bar = ChartBuilder::on(&side)
        .margin_top(44)
        .margin_bottom(60)
        .margin_right(8)
        .y_label_area_size(56)
        .build_cartesian_2d(0.0..1.0, 0.0..peak as f64)
        .map_err(err)?;
    bar.configure_mesh()
        .disable_mesh()
        .disable_x_axis()
        .y_desc("visitors per cell")
        .y_label_formatter(&|v| format!("{v:.0}"))
        .axis_desc_style((FONT, 14))
        .label_style((FONT, 12))
        .draw()
        .map_err(err)?;
    let steps = 100;
    bar.draw_series((0..steps).map(|k| {
        let (lo, hi) = (
            k as f64 / steps as f64 * peak as f64,
            (k + 1) as f64 / steps as f64 * peak as f64,
        );
        Rectangle::new(
            [(0.0, lo), (1.0, hi)],
            ViridisRGB::get_color_normalized(lo, 0.0, peak as f64).filled(),
        )
    }))
    .map_err(err)?;
    root.present().map_err(err)?;
    Ok(())
}
