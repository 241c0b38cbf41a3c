//! Wilson intervals against known figures; pass@k and pass^k edge cases.

use keel_eval::stats::is_flaky;
use keel_eval::{StatsError, pass_at_k, pass_pow_k, wilson};

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 5e-4
}

#[test]
fn wilson_matches_known_values() {
    let i = wilson(8, 10);
    assert!(close(i.lo, 0.490) && close(i.hi, 0.943), "{i:?}");
    let i = wilson(10, 10);
    assert!(close(i.lo, 0.722) && close(i.hi, 1.0), "{i:?}");
    let i = wilson(0, 10);
    assert!(close(i.lo, 0.0) && close(i.hi, 0.278), "{i:?}");
    let i = wilson(4, 10);
    assert!(close(i.lo, 0.168) && close(i.hi, 0.687), "{i:?}");
    let i = wilson(50, 100);
    assert!(close(i.lo, 0.404) && close(i.hi, 0.596), "{i:?}");
    let i = wilson(0, 0);
    assert_eq!((i.lo, i.hi), (0.0, 1.0));
}

#[test]
fn pass_at_k_and_pass_pow_k() {
    // c = 0: nothing passes.
    assert_eq!(pass_at_k(5, 0, 3).unwrap(), 0.0);
    assert_eq!(pass_pow_k(5, 0, 3).unwrap(), 0.0);
    // c = n: everything passes.
    assert_eq!(pass_at_k(5, 5, 3).unwrap(), 1.0);
    assert_eq!(pass_pow_k(5, 5, 3).unwrap(), 1.0);
    // k = 1 is the pass rate.
    assert!((pass_at_k(10, 8, 1).unwrap() - 0.8).abs() < 1e-12);
    assert!((pass_pow_k(10, 8, 1).unwrap() - 0.8).abs() < 1e-12);
    // n=5, c=2, k=2: pass@2 = 1 - C(3,2)/C(5,2) = 0.7; pass^2 = C(2,2)/C(5,2) = 0.1.
    assert!((pass_at_k(5, 2, 2).unwrap() - 0.7).abs() < 1e-12);
    assert!((pass_pow_k(5, 2, 2).unwrap() - 0.1).abs() < 1e-12);
    // Fewer failures than k: some draw always passes.
    assert_eq!(pass_at_k(5, 4, 2).unwrap(), 1.0);
    // k = n: pass^n is all-passed.
    assert_eq!(pass_pow_k(3, 2, 3).unwrap(), 0.0);
    // Errors.
    assert_eq!(
        pass_at_k(3, 1, 4),
        Err(StatsError::KExceedsTrials { k: 4, n: 3 })
    );
    assert_eq!(pass_pow_k(3, 1, 0), Err(StatsError::ZeroK));
    assert_eq!(
        pass_at_k(3, 4, 1),
        Err(StatsError::TooManyPasses { c: 4, n: 3 })
    );
    assert_eq!(
        pass_at_k(3, 1, 4).unwrap_err().to_string(),
        "k = 4 exceeds the 3 trials run: run at least k trials or lower `suite.k`"
    );
}

#[test]
fn flaky_means_some_but_not_all() {
    assert!(!is_flaky(3, 0));
    assert!(is_flaky(3, 1));
    assert!(!is_flaky(3, 3));
    assert!(!is_flaky(0, 0));
}
