//! The drift distances between a reference and a current window of feature
//! vectors: the two-sample Kolmogorov–Smirnov statistic (per dimension, the
//! largest), and the (biased) squared maximum mean discrepancy with a Gaussian
//! kernel whose bandwidth is given or the median pairwise distance.

/// The two-sample KS statistic sup |F_a - F_b| of dimension `dim`, largest over
/// all dimensions. 0 when either window is empty.
pub fn ks_statistic(a: &[&[f32]], b: &[&[f32]]) -> f64 {
    let dims = a.iter().chain(b).map(|v| v.len()).min().unwrap_or(0);
    (0..dims).map(|d| ks_1d(a, b, d)).fold(0.0, f64::max)
}

fn ks_1d(a: &[&[f32]], b: &[&[f32]], dim: usize) -> f64 {
    if a.is_empty() || b.is_empty() {
        return 0.0;
    }
    let sorted = |w: &[&[f32]]| {
        let mut v: Vec<f32> = w.iter().map(|x| x[dim]).collect();
        v.sort_by(f32::total_cmp);
        v
    };
    let (x, y) = (sorted(a), sorted(b));
    let (n, m) = (x.len() as f64, y.len() as f64);
    let (mut i, mut j, mut d) = (0, 0, 0.0f64);
    while i < x.len() && j < y.len() {
        // Step past every value equal to the smaller one in both samples, then compare.
        let v = if x[i].total_cmp(&y[j]).is_le() {
            x[i]
        } else {
            y[j]
        };
        while i < x.len() && x[i] == v {
            i += 1;
        }
        while j < y.len() && y[j] == v {
            j += 1;
        }
        d = d.max((i as f64 / n - j as f64 / m).abs());
    }
    d
}

fn sq_dist(a: &[f32], b: &[f32]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (*x as f64 - *y as f64).powi(2))
        .sum()
}

/// The median Euclidean distance between distinct vectors of both windows
/// pooled (1 when all are equal).
pub fn median_bandwidth(a: &[&[f32]], b: &[&[f32]]) -> f64 {
    let pooled: Vec<&[f32]> = a.iter().chain(b).copied().collect();
    let mut d = Vec::with_capacity(pooled.len() * pooled.len().saturating_sub(1) / 2);
    for i in 0..pooled.len() {
        for j in i + 1..pooled.len() {
            d.push(sq_dist(pooled[i], pooled[j]).sqrt());
        }
    }
    if d.is_empty() {
        return 1.0;
    }
    let mid = d.len() / 2;
    let (_, m, _) = d.select_nth_unstable_by(mid, f64::total_cmp);
    if *m > 0.0 { *m } else { 1.0 }
}

/// Biased MMD² between the windows with kernel exp(-|x-y|² / (2 σ²)):
/// mean k(a,a') + mean k(b,b') - 2 mean k(a,b). 0 when either window is empty.
pub fn gaussian_mmd2(a: &[&[f32]], b: &[&[f32]], sigma: f64) -> f64 {
    if a.is_empty() || b.is_empty() {
        return 0.0;
    }
    let gamma = 1.0 / (2.0 * sigma * sigma);
    let mean_k = |x: &[&[f32]], y: &[&[f32]]| {
        let mut s = 0.0;
        for p in x {
            for q in y {
                s += (-gamma * sq_dist(p, q)).exp();
            }
        }
        s / (x.len() * y.len()) as f64
    };
    (mean_k(a, a) + mean_k(b, b) - 2.0 * mean_k(a, b)).max(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(v: &[f32]) -> Vec<Vec<f32>> {
        v.iter().map(|x| vec![*x]).collect()
    }
    fn r(v: &[Vec<f32>]) -> Vec<&[f32]> {
        v.iter().map(|x| x.as_slice()).collect()
    }

    #[test]
    fn ks_by_hand() {
        // a = {1,2,3,4}, b = {3,4,5,6}: after 2, F_a = 1/2 and F_b = 0 -> D = 0.5.
        let (a, b) = (w(&[1., 2., 3., 4.]), w(&[3., 4., 5., 6.]));
        assert!((ks_statistic(&r(&a), &r(&b)) - 0.5).abs() < 1e-12);
        // Disjoint: 1. Identical: 0. Ties across samples are stepped together.
        assert_eq!(ks_statistic(&r(&w(&[1., 2.])), &r(&w(&[3., 4.]))), 1.0);
        assert_eq!(ks_statistic(&r(&a), &r(&a)), 0.0);
        let (c, d) = (w(&[1., 1., 2.]), w(&[1., 2., 2.]));
        assert!((ks_statistic(&r(&c), &r(&d)) - 1.0 / 3.0).abs() < 1e-12);
        // Two dimensions: the larger statistic wins.
        let x = vec![vec![0., 0.], vec![1., 0.]];
        let y = vec![vec![0., 5.], vec![1., 6.]];
        assert_eq!(ks_statistic(&r(&x), &r(&y)), 1.0);
    }

    #[test]
    fn mmd_by_hand() {
        // a = {0}, b = {1}, σ = 1: k(0,1) = e^-0.5, MMD² = 1 + 1 - 2 e^-0.5.
        let (a, b) = (w(&[0.]), w(&[1.]));
        let want = 2.0 - 2.0 * (-0.5f64).exp();
        assert!((gaussian_mmd2(&r(&a), &r(&b), 1.0) - want).abs() < 1e-12);
        assert_eq!(gaussian_mmd2(&r(&a), &r(&a), 1.0), 0.0);
        // Median heuristic: distances {1, 2, 1} between 0, 1, 2 -> median 1.
        let c = w(&[2.]);
        let mut pooled = a.clone();
        pooled.extend(b.clone());
        assert_eq!(median_bandwidth(&r(&pooled), &r(&c)), 1.0);
        assert_eq!(median_bandwidth(&r(&a), &r(&a)), 1.0);
    }
}
