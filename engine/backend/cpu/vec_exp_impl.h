// VecExp, the vectorised e^x of the CPU kernels, for a vector-operations class S (V, Set1, Min,
// Max, Round, Mul, Fma, Add, Ldexp). No include guard and no includes, like simd_kernels_impl.h
// (which includes it): each user includes it inside its own anonymous namespace, so the copies of
// different ISAs never meet at link time.
//
// e^x for every lane, clamped to [-87, 88] (results stay normal floats): x = n ln2 + r with
// |r| <= ln2 / 2, e^r = 1 + r + r^2 P(r) with Cephes' expf coefficients (P of degree 5), times
// 2^n. Within 2 ulp of exp over [-87, 0] on every ISA (tests/engine/backend/cpu_kernels_test.cc).
template <class S>
typename S::V VecExp(typename S::V x) {
  using V = typename S::V;
  x = S::Min(S::Max(x, S::Set1(-87.0f)), S::Set1(88.0f));
  const V n = S::Round(S::Mul(x, S::Set1(1.44269504088896341f)));
  V r = S::Fma(n, S::Set1(-0.693359375f), x);  // ln2 in two parts: n * hi is exact
  r = S::Fma(n, S::Set1(2.12194440e-4f), r);
  V p = S::Set1(1.9875691500e-4f);
  p = S::Fma(p, r, S::Set1(1.3981999507e-3f));
  p = S::Fma(p, r, S::Set1(8.3334519073e-3f));
  p = S::Fma(p, r, S::Set1(4.1665795894e-2f));
  p = S::Fma(p, r, S::Set1(1.6666665459e-1f));
  p = S::Fma(p, r, S::Set1(5.0000001201e-1f));
  p = S::Fma(p, S::Mul(r, r), S::Add(r, S::Set1(1.0f)));
  return S::Ldexp(p, n);
}
