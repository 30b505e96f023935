//! Writing the report directory: `report.md`, one CSV per table, the SVG charts and a
//! self-contained `index.html` (charts inline, no scripts, no network).

use std::fmt::Write as _;
use std::fs;
use std::path::Path;

use super::accum::Acc;
use super::charts::{self, Chart};
use super::tables::{self, Cell, Column, Kind, Table};

/// What the report says about the run.
#[derive(Clone, Debug, Default)]
pub struct Meta {
    /// Report title.
    pub title: String,
    /// The input, as given on the command line.
    pub input: String,
    /// One line per option that shaped the numbers (format policy, tau, ...).
    pub settings: Vec<String>,
}

/// A heading that groups the views after it (they become its subsections).
struct Section {
    id: &'static str,
    title: String,
    intro: Vec<String>,
}

/// One view: a table, its charts, what its empty form needs, its heading level, and the
/// section it opens (if any).
struct View<'a> {
    table: Table,
    charts: Vec<&'a Chart>,
    needs: &'static str,
    level: usize,
    section: Option<Section>,
}

/// Files written, relative to the report directory.
pub type Written = Vec<String>;

const RUBRIC_TURN: &str = "valid rubrics on lines with \"turn\"";
const RUBRIC_EMOTION: &str = "valid rubrics on lines with \"emotion\"";
const HEALTH: &str = "care reward output lines or care serve --log records";

/// The report's sections in order, each with its charts.
fn views<'a>(acc: &Acc, charts: &'a [Chart]) -> Vec<View<'a>> {
    let pick = |prefix: &str| -> Vec<&'a Chart> {
        charts
            .iter()
            .filter(|c| c.file.starts_with(prefix))
            .collect()
    };
    let view = |table: Table, prefix: &str, needs: &'static str| View {
        table,
        charts: pick(prefix),
        needs,
        level: 2,
        section: None,
    };
    let sub = |table: Table, prefix: &str, needs: &'static str| View {
        level: 3,
        ..view(table, prefix, needs)
    };
    let mut out = vec![
        view(
            tables::preference(acc),
            "preference_recovery.",
            "lines with \"chosen_scores\" and \"rejected_scores\" under a \"rubric\", or \
             with \"chosen_reward\" and \"rejected_reward\"",
        ),
        view(
            tables::weights_by_turn(acc),
            "weights_by_turn.",
            RUBRIC_TURN,
        ),
        view(
            super::trend::slopes(acc),
            "trend.",
            "valid rubrics on lines with \"turn\", in at least two turns",
        ),
        view(
            super::trend::crossings(acc),
            "crossing.",
            "two dimensions whose mean weights cross between turns",
        ),
        view(
            tables::dominant_by_turn(acc),
            "dominant_by_turn.",
            RUBRIC_TURN,
        ),
        view(
            tables::weights_by_emotion(acc),
            "weights_by_emotion.",
            RUBRIC_EMOTION,
        ),
        view(
            tables::dominant_by_emotion(acc),
            "dominant_by_emotion.",
            RUBRIC_EMOTION,
        ),
        view(
            tables::weights_by_valence(acc),
            "weights_by_valence.",
            "valid rubrics on lines with an \"emotion\" that --valence maps",
        ),
        view(
            tables::dominant_by_valence(acc),
            "dominant_by_valence.",
            "valid rubrics on lines with an \"emotion\" that --valence maps",
        ),
        view(
            tables::strategy_by_variant(acc),
            "strategy_by_variant.",
            "lines with \"tactics\"",
        ),
        view(
            tables::strategy_by_emotion(acc),
            "strategy_by_emotion_",
            "lines with \"tactics\" and \"emotion\"",
        ),
        view(
            tables::unknown_labels(acc),
            "unknown_labels.",
            "tactic labels outside the label set, under --unknown-label ignore",
        ),
        view(
            super::verdict::table(&acc.verdicts, &acc.settings.compare),
            "verdicts.",
            "lines with a \"verdict\"",
        ),
        view(
            super::compare::table(acc),
            "compare_",
            "--compare A,B naming two variants with data in the same view",
        ),
        view(
            tables::format_health(acc),
            "format_valid.",
            "rubrics (\"text\", \"rubric\", or a care validate result)",
        ),
        view(
            tables::violations(acc),
            "violations.",
            "rubrics with at least one violation",
        ),
        view(
            tables::criteria_counts(acc),
            "criteria_counts.",
            "rubrics that parsed",
        ),
        view(
            tables::weight_sum_error(acc),
            "weight_sum_error.",
            "rubrics that parsed",
        ),
    ];
    let mut health = vec![
        View {
            section: Some(Section {
                id: "health",
                title: "Reward health".to_owned(),
                intro: super::health::summary(acc),
            }),
            ..sub(super::health::flags_table(acc), "health_flags.", HEALTH)
        },
        sub(super::health::length_table(acc), "health_length.", HEALTH),
        sub(super::health::groups_table(acc), "health_groups.", HEALTH),
        sub(super::health::scores_table(acc), "health_scores.", HEALTH),
        sub(super::health::loop_table(acc), "health_loop.", HEALTH),
        sub(super::health::panel_table(acc), "health_panel.", HEALTH),
        sub(
            super::health::entropy_table(acc),
            "health_entropy.",
            "valid rubrics on health lines",
        ),
    ];
    out.append(&mut health);
    out
}

/// Every chart of the report, in report order.
///
/// # Errors
/// A chart that cannot be drawn.
pub fn all_charts(acc: &Acc) -> Result<Vec<Chart>, String> {
    let mut charts = charts::all(acc)?;
    charts.extend(super::views::valence(acc)?);
    charts.extend(super::views::unknown_labels(acc)?);
    charts.extend(super::views::trend(acc)?);
    charts.extend(super::views::verdicts(&acc.verdicts)?);
    charts.extend(super::views::comparisons(acc)?);
    charts.extend(super::views::health(acc)?);
    Ok(charts)
}

/// Writes the whole report (except `errors.jsonl`, written while streaming) into `dir`.
///
/// # Errors
/// A chart that cannot be drawn or a file that cannot be written, as one message.
pub fn write(dir: &Path, acc: &Acc, meta: &Meta) -> Result<Written, String> {
    let charts = all_charts(acc)?;
    let views = views(acc, &charts);
    let skipped = tables::skipped(acc);
    let mut written = Vec::new();
    let put = |name: &str, text: &str, written: &mut Written| -> Result<(), String> {
        let path = dir.join(name);
        fs::write(&path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        written.push(name.to_owned());
        Ok(())
    };
    for c in &charts {
        put(&c.file, &c.svg, &mut written)?;
    }
    for t in views
        .iter()
        .map(|v| &v.table)
        .chain(std::iter::once(&skipped))
    {
        put(&format!("{}.csv", t.name), &csv(t), &mut written)?;
    }
    put(
        "report.md",
        &markdown(acc, meta, &views, &skipped),
        &mut written,
    )?;
    put(
        "index.html",
        &html(acc, meta, &views, &skipped),
        &mut written,
    )?;
    Ok(written)
}

fn csv_field(out: &mut String, s: &str) {
    if s.contains([',', '"', '\n', '\r']) || s.starts_with(' ') || s.ends_with(' ') {
        out.push('"');
        out.push_str(&s.replace('"', "\"\""));
        out.push('"');
    } else {
        out.push_str(s);
    }
}

/// Full precision: the shortest decimal that reads back as the same `f64`.
fn num(x: f64) -> String {
    format!("{x}")
}

/// The table as CSV (RFC 4180: header row, CRLF line ends, fields with a comma, quote or line
/// break quoted); interval and share columns expand into several columns (see [`Kind`]).
pub fn csv(t: &Table) -> String {
    let mut out = String::new();
    let mut header: Vec<String> = Vec::new();
    for c in &t.columns {
        match c.kind {
            Kind::Plain => header.push(c.name.clone()),
            Kind::Interval => header.extend([
                c.name.clone(),
                format!("{}_lo", c.name),
                format!("{}_hi", c.name),
            ]),
            Kind::Share => header.extend([c.name.clone(), format!("{}_share", c.name)]),
        }
    }
    push_row(&mut out, header);
    for row in &t.rows {
        let mut fields = Vec::new();
        for (cell, c) in row.iter().zip(&t.columns) {
            let width = match c.kind {
                Kind::Plain => 1,
                Kind::Interval => 3,
                Kind::Share => 2,
            };
            let mut f: Vec<String> = match cell {
                Cell::Text(s) => vec![s.clone()],
                Cell::Int(k) => vec![k.to_string()],
                Cell::Num(x) => vec![num(*x)],
                Cell::Rate(p, ci) | Cell::Mean(p, ci) => match ci {
                    Some(ci) => vec![num(*p), num(ci.lo), num(ci.hi)],
                    None => vec![num(*p)],
                },
                Cell::Share(k, n) => {
                    let share = if *n == 0 {
                        String::new()
                    } else {
                        num(*k as f64 / *n as f64)
                    };
                    vec![k.to_string(), share]
                }
                Cell::Empty => Vec::new(),
            };
            f.resize(width, String::new());
            fields.extend(f);
        }
        push_row(&mut out, fields);
    }
    out
}

fn push_row(out: &mut String, fields: Vec<String>) {
    for (i, f) in fields.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        csv_field(out, f);
    }
    out.push_str("\r\n");
}

fn pct(p: f64) -> String {
    format!("{:.1}%", p * 100.0)
}

/// Three decimals (a value that rounds to zero prints as `0.000`, without a sign).
fn short_num(x: f64) -> String {
    let s = format!("{x:.3}");
    if s == "-0.000" { "0.000".to_owned() } else { s }
}

/// A small magnitude such as a rounding error: three significant digits.
fn tiny_num(x: f64) -> String {
    if x != 0.0 && x.abs() < 1e-3 {
        format!("{x:.2e}")
    } else {
        short_num(x)
    }
}

/// A cell as shown in Markdown and HTML.
pub fn display(cell: &Cell) -> String {
    match cell {
        Cell::Text(s) => s.clone(),
        Cell::Int(k) => k.to_string(),
        Cell::Num(x) => tiny_num(*x),
        Cell::Rate(p, Some(ci)) => {
            format!("{} [{:.1}, {:.1}]", pct(*p), ci.lo * 100.0, ci.hi * 100.0)
        }
        Cell::Rate(p, None) => pct(*p),
        Cell::Mean(m, Some(ci)) => {
            format!(
                "{} [{}, {}]",
                short_num(*m),
                short_num(ci.lo),
                short_num(ci.hi)
            )
        }
        Cell::Mean(m, None) => short_num(*m),
        Cell::Share(_, 0) => "–".to_owned(),
        Cell::Share(k, n) => format!("{} ({k})", pct(*k as f64 / *n as f64)),
        Cell::Empty => "–".to_owned(),
    }
}

fn header_text(c: &Column) -> String {
    let mut h = c.name.replace('_', " ");
    if c.kind == Kind::Interval {
        h.push_str(" [95% CI]");
    }
    h
}

fn is_numeric(cell: &Cell) -> bool {
    !matches!(cell, Cell::Text(_))
}

fn md_escape(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('|', "\\|")
        .replace(['\n', '\r'], " ")
}

fn md_table(out: &mut String, t: &Table) {
    let _ = writeln!(
        out,
        "| {} |",
        t.columns
            .iter()
            .map(|c| md_escape(&header_text(c)))
            .collect::<Vec<_>>()
            .join(" | ")
    );
    let _ = writeln!(
        out,
        "|{}|",
        t.columns
            .iter()
            .enumerate()
            .map(|(i, _)| {
                let numeric = t
                    .rows
                    .first()
                    .and_then(|r| r.get(i))
                    .is_some_and(is_numeric);
                if numeric { "---:" } else { "---" }
            })
            .collect::<Vec<_>>()
            .join("|")
    );
    for row in &t.rows {
        let _ = writeln!(
            out,
            "| {} |",
            row.iter()
                .map(|c| md_escape(&display(c)))
                .collect::<Vec<_>>()
                .join(" | ")
        );
    }
}

fn summary_line(acc: &Acc) -> String {
    let skipped = acc.skipped_lines();
    format!(
        "{} lines read, {} analyzed, {} skipped.",
        acc.lines,
        acc.lines - skipped,
        skipped
    )
}

/// `n` and the noun, singular or plural: `"1 rubric"`, `"2 rubrics"`.
pub fn counted(n: u64, one: &str, many: &str) -> String {
    if n == 1 {
        format!("1 {one}")
    } else {
        format!("{n} {many}")
    }
}

/// The verb that agrees with a count: `(singular, plural)`.
fn agree(n: u64, forms: (&'static str, &'static str)) -> &'static str {
    if n == 1 { forms.0 } else { forms.1 }
}

const HAS: (&str, &str) = ("has", "have");
const IS: (&str, &str) = ("is", "are");
const WAS: (&str, &str) = ("was", "were");

/// Notes on what each view leaves out, and why.
fn notes(acc: &Acc) -> Vec<String> {
    let mut out = Vec::new();
    for (name, v) in &acc.variants {
        let name = tables::variant_name(name);
        let mut missing = |n: u64, what: (&str, &str), member: &str, views: &str| {
            if n > 0 {
                out.push(format!(
                    "{name}: {} {} no \"{member}\" and {} not in {views}.",
                    counted(n, what.0, what.1),
                    agree(n, HAS),
                    agree(n, IS)
                ));
            }
        };
        missing(
            v.valid_without_turn,
            ("valid rubric", "valid rubrics"),
            "turn",
            "the turn views",
        );
        missing(
            v.valid_without_emotion,
            ("valid rubric", "valid rubrics"),
            "emotion",
            "the emotion views",
        );
        missing(
            v.responses_without_emotion,
            ("response with tactics", "responses with tactics"),
            "emotion",
            "the strategy-by-emotion view",
        );
        let invalid = v.rubrics.total - v.rubrics.valid;
        if invalid > 0 {
            out.push(format!(
                "{name}: {invalid} of {} {} not valid (r_fmt = 0) and left out of the weight and \
                 dominance views.",
                counted(v.rubrics.total, "rubric", "rubrics"),
                agree(invalid, IS)
            ));
        }
        let unscored = v.pairs.outcomes[3];
        if unscored > 0 {
            out.push(format!(
                "{name}: {} {} no rubric that parsed and {} not in the win/tie/loss rates.",
                counted(unscored, "pair", "pairs"),
                agree(unscored, HAS),
                agree(unscored, IS)
            ));
        }
        let unmapped: u64 = v
            .by_emotion
            .iter()
            .enumerate()
            .filter(|(e, _)| acc.valence.of(*e).is_none())
            .map(|(_, a)| a.n())
            .sum();
        if unmapped > 0 && !acc.valence.names.is_empty() {
            out.push(format!(
                "{name}: {} of an emotion without a valence (--valence maps them) and {} not in \
                 the valence views.",
                counted(unmapped, "valid rubric is", "valid rubrics are"),
                agree(unmapped, IS)
            ));
        }
        if v.unknown_tactics > 0 {
            out.push(format!(
                "{name}: {} {} left out (--unknown-label ignore).",
                counted(
                    v.unknown_tactics,
                    "unknown tactic label",
                    "unknown tactic labels"
                ),
                agree(v.unknown_tactics, WAS)
            ));
        }
    }
    out.extend(super::compare::notes(acc));
    out
}

fn markdown(acc: &Acc, meta: &Meta, views: &[View<'_>], skipped: &Table) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "# {}\n", md_escape(&meta.title));
    let _ = writeln!(
        out,
        "Input `{}`: {}\n",
        meta.input.replace('`', "'"),
        summary_line(acc)
    );
    for s in &meta.settings {
        let _ = writeln!(out, "- {s}");
    }
    let _ = writeln!(
        out,
        "- Intervals: 95% Wilson score intervals for rates and shares of counts; 95% Student-t \
         intervals for means (none below two values)."
    );
    out.push('\n');
    for v in views {
        if let Some(sec) = &v.section {
            let _ = writeln!(out, "## {}\n", sec.title);
            for line in &sec.intro {
                let _ = writeln!(out, "{}\n", md_escape(line));
            }
        }
        let _ = writeln!(out, "{} {}\n", "#".repeat(v.level), v.table.title);
        let _ = writeln!(out, "{}\n", v.table.caption);
        if v.table.rows.is_empty() {
            let _ = writeln!(out, "_No data for this view: it needs {}._\n", v.needs);
            continue;
        }
        for c in &v.charts {
            let _ = writeln!(out, "![{}]({})\n", md_escape(&c.title), c.file);
        }
        md_table(&mut out, &v.table);
        let _ = writeln!(out, "\nCSV: [{0}.csv]({0}.csv)\n", v.table.name);
    }
    let _ = writeln!(out, "## {}\n", skipped.title);
    if skipped.rows.is_empty() {
        let _ = writeln!(out, "No line was skipped.\n");
    } else {
        let _ = writeln!(out, "{}\n", skipped.caption);
        md_table(&mut out, skipped);
        let _ = writeln!(out, "\nFirst skipped lines:\n");
        for e in &acc.examples {
            let _ = writeln!(
                out,
                "- line {}: `{}`: {}",
                e.line,
                e.code,
                md_escape(&e.message)
            );
        }
        out.push('\n');
    }
    let notes = notes(acc);
    if !notes.is_empty() {
        let _ = writeln!(out, "## Notes\n");
        for n in notes {
            let _ = writeln!(out, "- {}", md_escape(&n));
        }
        out.push('\n');
    }
    out
}

/// Escapes text for HTML element content and attribute values.
pub fn html_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

fn html_table(out: &mut String, t: &Table) {
    out.push_str("<div class=\"scroll\"><table>\n<thead><tr>");
    for c in &t.columns {
        let _ = write!(out, "<th>{}</th>", html_escape(&header_text(c)));
    }
    out.push_str("</tr></thead>\n<tbody>\n");
    for row in &t.rows {
        out.push_str("<tr>");
        for cell in row {
            let class = if is_numeric(cell) { " class=\"n\"" } else { "" };
            let _ = write!(out, "<td{class}>{}</td>", html_escape(&display(cell)));
        }
        out.push_str("</tr>\n");
    }
    out.push_str("</tbody></table></div>\n");
}

const CSS: &str = "body{font-family:system-ui,-apple-system,'Segoe UI',Roboto,sans-serif;\
margin:0 auto;max-width:1400px;padding:16px 28px;color:#222;background:#fff}\
h1{font-size:1.7em;margin-bottom:4px}h2{margin-top:2.2em;border-bottom:1px solid #ddd;\
padding-bottom:4px}nav ol{columns:2;font-size:.95em}figure{margin:12px 0}\
svg{max-width:100%;height:auto;border:1px solid #eee}\
.scroll{overflow-x:auto}table{border-collapse:collapse;font-size:.9em;margin:8px 0}\
th,td{border:1px solid #ddd;padding:3px 8px;text-align:left;white-space:nowrap}\
th{background:#f4f4f4}td.n{text-align:right;font-variant-numeric:tabular-nums}\
.empty{color:#777;font-style:italic}.caption{max-width:70em}\
.verdict{font-weight:600}";

fn html(acc: &Acc, meta: &Meta, views: &[View<'_>], skipped: &Table) -> String {
    let mut out = String::new();
    let title = html_escape(&meta.title);
    let _ = write!(
        out,
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
         <title>{title}</title>\n<style>{CSS}</style>\n</head>\n<body>\n<h1>{title}</h1>\n"
    );
    let _ = writeln!(
        out,
        "<p>Input <code>{}</code>: {}</p>\n<ul>",
        html_escape(&meta.input),
        html_escape(&summary_line(acc))
    );
    for s in &meta.settings {
        let _ = writeln!(out, "<li>{}</li>", html_escape(s));
    }
    out.push_str(
        "<li>Intervals: 95% Wilson score intervals for rates and shares of counts; 95% \
         Student-t intervals for means (none below two values).</li>\n</ul>\n<nav><ol>\n",
    );
    for v in views {
        let (id, title) = match &v.section {
            Some(sec) => (sec.id, sec.title.as_str()),
            None if v.level == 2 => (v.table.name, v.table.title.as_str()),
            None => continue,
        };
        let _ = writeln!(out, "<li><a href=\"#{id}\">{}</a></li>", html_escape(title));
    }
    let _ = writeln!(
        out,
        "<li><a href=\"#skipped\">{}</a></li>\n</ol></nav>",
        html_escape(&skipped.title)
    );
    for v in views {
        if let Some(sec) = &v.section {
            let _ = writeln!(
                out,
                "<h2 id=\"{}\">{}</h2>",
                sec.id,
                html_escape(&sec.title)
            );
            for line in &sec.intro {
                let _ = writeln!(out, "<p class=\"verdict\">{}</p>", html_escape(line));
            }
        }
        let _ = writeln!(
            out,
            "<section id=\"{id}\">\n<h{h}>{title}</h{h}>\n<p class=\"caption\">{caption}</p>",
            id = v.table.name,
            h = v.level,
            title = html_escape(&v.table.title),
            caption = html_escape(&v.table.caption)
        );
        if v.table.rows.is_empty() {
            let _ = writeln!(
                out,
                "<p class=\"empty\">No data for this view: it needs {}.</p>\n</section>",
                html_escape(v.needs)
            );
            continue;
        }
        for c in &v.charts {
            let _ = writeln!(
                out,
                "<figure role=\"img\" aria-label=\"{}\">\n{}</figure>",
                html_escape(&c.title),
                c.svg
            );
        }
        html_table(&mut out, &v.table);
        let _ = writeln!(
            out,
            "<p><a href=\"{0}.csv\">{0}.csv</a></p>\n</section>",
            v.table.name
        );
    }
    let _ = writeln!(
        out,
        "<section id=\"skipped\">\n<h2>{}</h2>",
        html_escape(&skipped.title)
    );
    if skipped.rows.is_empty() {
        out.push_str("<p>No line was skipped.</p>\n");
    } else {
        let _ = writeln!(
            out,
            "<p class=\"caption\">{}</p>",
            html_escape(&skipped.caption)
        );
        html_table(&mut out, skipped);
        out.push_str("<p>First skipped lines:</p>\n<ul>\n");
        for e in &acc.examples {
            let _ = writeln!(
                out,
                "<li>line {}: <code>{}</code>: {}</li>",
                e.line,
                html_escape(&e.code),
                html_escape(&e.message)
            );
        }
        out.push_str("</ul>\n");
    }
    let notes = notes(acc);
    if !notes.is_empty() {
        out.push_str("<h3>Notes</h3>\n<ul>\n");
        for n in notes {
            let _ = writeln!(out, "<li>{}</li>", html_escape(&n));
        }
        out.push_str("</ul>\n");
    }
    out.push_str("</section>\n</body>\n</html>\n");
    out
}
