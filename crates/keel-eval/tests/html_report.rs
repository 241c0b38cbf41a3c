//! The HTML report as text: self-contained (no external URL, script or stylesheet), every
//! scenario and trial present, suite-controlled strings escaped, the baseline chart drawn
//! only with a comparison. (A browser opens it in keel-cli's eval_cli tests.)

use keel_eval::{HtmlOptions, compare, render_html};

use crate::report_json::report;

#[test]
fn the_report_is_one_self_contained_page_with_every_scenario_and_trial() {
    let report = report();
    let html = render_html(&report, &HtmlOptions::default());
    assert!(html.starts_with("<!DOCTYPE html>"), "{}", &html[..40]);
    for forbidden in [
        "src=\"http",
        "href=\"http",
        "<link",
        "@import",
        "<script src",
    ] {
        assert!(!html.contains(forbidden), "external reference {forbidden}");
    }
    for scenario in &report.scenarios {
        assert!(
            html.contains(&format!("data-scenario=\"{}\"", scenario.id)),
            "{}",
            scenario.id
        );
    }
    let trials: usize = report.scenarios.iter().map(|s| s.trials.len()).sum();
    assert_eq!(html.matches("class=\"trial-cell\"").count(), trials);
    assert_eq!(html.matches("<div class=\"trial\"").count(), trials);
    // No trace URL: each trial names the commands that show it.
    assert!(html.contains("keel threads show thread-0-0"));
    // Without a comparison there is no baseline chart, and the page says how to get one.
    assert!(!html.contains("id=\"baseline-chart\""));
    assert!(html.contains("id=\"no-baseline\""));
}

#[test]
fn strings_from_the_suite_and_the_runs_are_escaped() {
    let mut report = report();
    report.suite = "<script>alert(1)</script>".into();
    report.scenarios[0].id = "a\"b<i>".into();
    report.scenarios[0].trials[0].error = Some("</td><b>boom</b>".into());
    let html = render_html(&report, &HtmlOptions::default());
    assert!(!html.contains("<script>alert(1)"));
    assert!(html.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
    assert!(html.contains("data-scenario=\"a&quot;b&lt;i&gt;\""));
    assert!(html.contains("&lt;/td&gt;&lt;b&gt;boom&lt;/b&gt;"));
    // The only script is the report's own.
    assert_eq!(html.matches("<script>").count(), 1);
}

#[test]
fn a_trace_url_template_links_every_trial() {
    let report = report();
    let options = HtmlOptions {
        trace_url: Some("http://127.0.0.1:6006/trace/{trace_id}?thread={thread_id}".into()),
        subtitle: Some("nightly".into()),
    };
    let html = render_html(&report, &options);
    let trial = &report.scenarios[0].trials[0];
    assert!(html.contains(&format!(
        "href=\"http://127.0.0.1:6006/trace/{}?thread={}\"",
        trial.trace_id, trial.thread_id
    )));
    assert!(html.contains("nightly"));
}

#[test]
fn a_comparison_draws_each_change_with_its_significance() {
    let current = report();
    let mut better = report();
    for s in &mut better.scenarios {
        s.pass_rate = 1.0;
        s.ci95 = keel_eval::Interval { lo: 0.99, hi: 1.0 };
    }
    let comparison = compare(&current, &better, 0.05);
    assert!(!comparison.regressions.is_empty());
    let mut attached = current.clone();
    attached.attach(&comparison);
    let html = render_html(&attached, &HtmlOptions::default());
    assert!(html.contains("id=\"baseline-chart\""));
    let drawn = html.matches("<title>").count();
    // The page's own <title> plus one per trial square plus one per change.
    let trials: usize = current.scenarios.iter().map(|s| s.trials.len()).sum();
    assert_eq!(
        drawn,
        1 + trials + comparison.regressions.len() + comparison.improvements.len()
    );
}
