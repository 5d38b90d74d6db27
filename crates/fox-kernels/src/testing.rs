//! What the CPU ops' tests share: standard normal inputs, and a gradient checked against
//! central differences of a loss.

use rand::Rng;
use rand_chacha::ChaCha8Rng;
use rand_distr::StandardNormal;

/// n standard normal values.
pub fn randn(rng: &mut ChaCha8Rng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.sample(StandardNormal)).collect()
}

/// (loss(x + e·1ᵢ) − loss(x − e·1ᵢ)) / 2e, the loss in f64 and the quotient in f32 as the
/// gradients are.
pub fn central_difference(x: &[f32], i: usize, e: f32, loss: impl Fn(&[f32]) -> f64) -> f32 {
    let (mut p, mut m) = (x.to_vec(), x.to_vec());
    p[i] += e;
    m[i] -= e;
    ((loss(&p) - loss(&m)) / (2.0 * e as f64)) as f32
}

/// `grad` at the elements `at` of `x` within tol · (1 + |fd|) of [`central_difference`] (step
/// e); `what` names the gradient in a failure.
pub fn assert_gradient(
    what: &str,
    grad: &[f32],
    x: &[f32],
    at: impl IntoIterator<Item = usize>,
    (e, tol): (f32, f32),
    loss: impl Fn(&[f32]) -> f64,
) {
    for i in at {
        let fd = central_difference(x, i, e, &loss);
        assert!((fd - grad[i]).abs() < tol * (1.0 + fd.abs()), "{what}[{i}]: fd {fd} vs {}", grad[i]);
    }
}
