//! Drawing a report: busbw and time against size, one series per library, with plotters' SVG
//! backend; a `.png` path is rasterised from the same SVG by resvg with the system's fonts. A
//! report written earlier with `--json` is drawn again by [`plot_from_json`] (`--from-json`).
//!
//! Invariant: the PNG is the SVG, rendered — there is one drawing, not two.

use super::args::knobs_suffix;
use super::collective::BenchCollective;
use super::report::{Report, Row};
use crate::Failure;
use std::path::{Path, PathBuf};

/// One plot per collective of `collectives` (those with rows), titled `"<collective> <what>"`: at
/// `path` itself when there is one, else at [`plot_path`] for each.
pub fn write_plots(
    path: &Path,
    rows: &[Row],
    collectives: &[BenchCollective],
    what: &str,
) -> Result<(), String> {
    let drawn: Vec<BenchCollective> = collectives
        .iter()
        .copied()
        .filter(|c| rows.iter().any(|r| r.collective == *c))
        .collect();
    for &c in &drawn {
        let target = if drawn.len() == 1 {
            path.to_path_buf()
        } else {
            plot_path(path, c)
        };
        let mine: Vec<Row> = rows.iter().filter(|r| r.collective == c).cloned().collect();
        write_plot(&target, &mine, &format!("{} {what}", c.name()))?;
        out!("# plot: {}", target.display());
    }
    Ok(())
}

/// `--from-json`: reads a report written earlier with `--json` and draws it to `plot`; no GPU
/// needed.
pub fn plot_from_json(source: &Path, plot: Option<&Path>) -> Result<(), Failure> {
    let text = std::fs::read_to_string(source)
        .map_err(|e| Failure::Failed(format!("{}: {e}", source.display())))?;
    let report: Report = serde_json::from_str(&text)
        .map_err(|e| Failure::Failed(format!("{}: not a bench report: {e}", source.display())))?;
    let Some(path) = plot else {
        return Err(Failure::Failed(
            "--from-json needs --plot FILE.svg|.png".into(),
        ));
    };
    let when = report
        .header
        .iter()
        .find(|(k, _)| k == "date")
        .map_or(String::new(), |(_, v)| format!(", {v}"));
    let what = format!(
        "{}{when}{}",
        source.display(),
        knobs_suffix(report.chunk_bytes, report.slots)
    );
    write_plots(path, &report.rows, &report.collectives, &what)?;
    Ok(())
}

/// `bench.svg` for all_gather → `bench-all_gather.svg` (the collective before the extension).
pub fn plot_path(path: &Path, collective: BenchCollective) -> PathBuf {
    let stem = path
        .file_stem()
        .map_or_else(String::new, |s| s.to_string_lossy().into_owned());
    let name = match path.extension() {
        Some(ext) => format!("{stem}-{}.{}", collective.name(), ext.to_string_lossy()),
        None => format!("{stem}-{}", collective.name()),
    };
    path.with_file_name(name)
}

/// Writes the plot to `path`: SVG as drawn, or PNG rasterised from the SVG (resvg, with the
/// system's fonts; where none are found the PNG has no text and a note says so).
pub fn write_plot(path: &Path, rows: &[Row], title: &str) -> Result<(), String> {
    // Rows that could not be measured (zero times) are not drawn.
    let rows: Vec<Row> = rows.iter().filter(|r| r.error.is_none()).cloned().collect();
    let svg = render_svg(&rows, title).map_err(|e| format!("plot {}: {e}", path.display()))?;
    let err = |e: &dyn std::fmt::Display| format!("plot {}: {e}", path.display());
    if is_png(path) {
        let mut options = resvg::usvg::Options::default();
        options.fontdb_mut().load_system_fonts();
        if options.fontdb.is_empty() {
            out!(
                "# note: no system fonts found: {} has no text (the SVG does)",
                path.display()
            );
        } else if let Some(family) = ["DejaVu Sans", "Liberation Sans", "Arial", "Noto Sans"]
            .into_iter()
            .find(|f| {
                options
                    .fontdb
                    .faces()
                    .any(|face| face.families.iter().any(|(n, _)| n == f))
            })
        {
            options.fontdb_mut().set_sans_serif_family(family);
        }
        let tree = resvg::usvg::Tree::from_str(&svg, &options).map_err(|e| err(&e))?;
        let size = tree.size().to_int_size();
        let mut pixmap = resvg::tiny_skia::Pixmap::new(size.width(), size.height())
            .ok_or_else(|| err(&"empty image"))?;
        resvg::render(
            &tree,
            resvg::tiny_skia::Transform::default(),
            &mut pixmap.as_mut(),
        );
        pixmap.save_png(path).map_err(|e| err(&e))
    } else {
        std::fs::write(path, svg).map_err(|e| err(&e))
    }
}

fn is_png(path: &Path) -> bool {
    path.extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| e.eq_ignore_ascii_case("png"))
}

/// Draws busbw (left) and time (right) against size, out of place, one series per library, as
/// an SVG document.
pub fn render_svg(rows: &[Row], title: &str) -> Result<String, String> {
    let mut svg = String::new();
    draw(&mut svg, rows, title)?;
    Ok(svg)
}

fn draw(svg: &mut String, rows: &[Row], title: &str) -> Result<(), String> {
    use plotters::prelude::*;
    let mut libs: Vec<&str> = Vec::new();
    for r in rows {
        if !libs.contains(&r.library.as_str()) {
            libs.push(&r.library);
        }
    }
    let (smin, smax) = rows.iter().fold((f64::MAX, 1.0f64), |(lo, hi), r| {
        let s = r.size_bytes as f64;
        (lo.min(s), hi.max(s))
    });
    let smin = if smin > smax { 1.0 } else { smin };
    let bmax = rows
        .iter()
        .map(|r| r.out_of_place.busbw_gbps)
        .fold(1.0, f64::max)
        * 1.1;
    let (tmin, tmax) = rows.iter().fold((f64::MAX, 1.0f64), |(lo, hi), r| {
        (
            lo.min(r.out_of_place.time_us),
            hi.max(r.out_of_place.time_us),
        )
    });
    let tmin = if tmin > tmax {
        0.1
    } else {
        (tmin / 2.0).max(1e-3)
    };
    let err = |e: &dyn std::fmt::Display| e.to_string();
    let root = SVGBackend::with_string(svg, (1400, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let root = root
        .titled(title, ("sans-serif", 18))
        .map_err(|e| err(&e))?;
    let (left, right) = root.split_horizontally(700);
    let colors = [BLUE, RED, GREEN, MAGENTA, CYAN, BLACK];
    let xr = (smin..smax * 1.5).log_scale();
    {
        let mut chart = ChartBuilder::on(&left)
            .caption("busbw (GB/s), out of place", ("sans-serif", 16))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(xr.clone(), 0.0..bmax)
            .map_err(|e| err(&e))?;
        chart
            .configure_mesh()
            .x_desc("size (B)")
            .x_label_formatter(&|x| size_tick(*x))
            .y_desc("busbw (GB/s)")
            .y_label_formatter(&|y| format!("{y:.0}"))
            .draw()
            .map_err(|e| err(&e))?;
        for (i, lib) in libs.iter().enumerate() {
            let c = colors[i % colors.len()];
            let pts: Vec<(f64, f64)> = rows
                .iter()
                .filter(|r| r.library == *lib)
                .map(|r| (r.size_bytes as f64, r.out_of_place.busbw_gbps))
                .collect();
            chart
                .draw_series(LineSeries::new(pts.clone(), c))
                .map_err(|e| err(&e))?
                .label(*lib)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c));
            chart
                .draw_series(pts.into_iter().map(|p| Circle::new(p, 3, c.filled())))
                .map_err(|e| err(&e))?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .border_style(BLACK)
            .draw()
            .map_err(|e| err(&e))?;
    }
    {
        let mut chart = ChartBuilder::on(&right)
            .caption("time per all-reduce (us), out of place", ("sans-serif", 16))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(xr, (tmin..tmax * 2.0).log_scale())
            .map_err(|e| err(&e))?;
        chart
            .configure_mesh()
            .x_desc("size (B)")
            .x_label_formatter(&|x| size_tick(*x))
            .y_desc("time (us)")
            .y_label_formatter(&|y| format!("{y}"))
            .draw()
            .map_err(|e| err(&e))?;
        for (i, lib) in libs.iter().enumerate() {
            let c = colors[i % colors.len()];
            let pts: Vec<(f64, f64)> = rows
                .iter()
                .filter(|r| r.library == *lib)
                .map(|r| (r.size_bytes as f64, r.out_of_place.time_us))
                .collect();
            chart
                .draw_series(LineSeries::new(pts.clone(), c))
                .map_err(|e| err(&e))?
                .label(*lib)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c));
            chart
                .draw_series(pts.into_iter().map(|p| Circle::new(p, 3, c.filled())))
                .map_err(|e| err(&e))?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .border_style(BLACK)
            .draw()
            .map_err(|e| err(&e))?;
    }
    root.present().map_err(|e| err(&e))?;
    Ok(())
}

/// An axis tick for a size in bytes: "8", "64K", "1M", "1G" (powers of 1024, as `-b`/`-e`).
fn size_tick(bytes: f64) -> String {
    let units = [(30, "G"), (20, "M"), (10, "K")];
    for (shift, unit) in units {
        let scale = (1u64 << shift) as f64;
        if bytes >= scale {
            return format!("{}{unit}", (bytes / scale * 10.0).round() / 10.0);
        }
    }
    format!("{}", bytes.round())
}

/// `Err` unless the plot path ends in `.svg` or `.png`.
pub fn check_plot_path(path: &Path) -> Result<(), String> {
    match path.extension().and_then(|e| e.to_str()) {
        Some(e) if e.eq_ignore_ascii_case("svg") || e.eq_ignore_ascii_case("png") => Ok(()),
        _ => Err(format!(
            "--plot {}: the file must end in .svg or .png",
            path.display()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::super::report::tests::row;
    use super::*;

    #[test]
    fn svg_has_both_series() {
        let dir =
            std::env::temp_dir().join(format!("ringreduce-bench-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("plot.svg");
        let mut rows = Vec::new();
        for (i, size) in [8u64, 1 << 10, 1 << 20, 1 << 30].into_iter().enumerate() {
            rows.push(row("ringreduce (auto)", size, 20.0 * (i + 1) as f64));
            rows.push(row("NCCL (NCCL_ALGO=Ring)", size, 18.0 * (i + 1) as f64));
        }
        write_plot(&path, &rows, "synthetic").unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        let png_path = dir.join("plot.png");
        write_plot(&png_path, &rows, "synthetic").unwrap();
        let png = std::fs::read(&png_path).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        assert!(svg.starts_with("<svg"), "{}", &svg[..svg.len().min(200)]);
        assert!(svg.contains("ringreduce (auto)"));
        assert!(svg.contains("NCCL (NCCL_ALGO=Ring)"));
        // A PNG of the drawing's size (1400 × 560): signature, then IHDR width and height.
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
        assert_eq!(u32::from_be_bytes(png[16..20].try_into().unwrap()), 1400);
        assert_eq!(u32::from_be_bytes(png[20..24].try_into().unwrap()), 560);
        // Not a blank canvas: the lines and text leave many distinct bytes after compression.
        assert!(png.len() > 10_000, "{} bytes", png.len());
        assert!(check_plot_path(Path::new("a.PNG")).is_ok());
        assert!(check_plot_path(Path::new("a.SVG")).is_ok());
        assert!(check_plot_path(Path::new("a.pdf"))
            .unwrap_err()
            .contains(".svg or .png"));
        assert_eq!(size_tick(8.0), "8");
        assert_eq!(size_tick(65536.0), "64K");
        assert_eq!(size_tick(1073741824.0), "1G");
    }
}
