"""The framework-neutral core on JAX arrays on a GPU: ringattn.attention and attention_backward take JAX
CUDA arrays through DLPack and return JAX arrays on the same device, equal to the f64 numpy reference
(reference.py) within bf16 tolerance. Skipped without JAX, without a GPU visible to JAX, or in a build
of ringattn without CUDA."""

import numpy as np
import pytest

jax = pytest.importorskip("jax", reason="JAX is not installed (run on a machine with it)")
import jax.numpy as jnp  # noqa: E402

import ringattn  # noqa: E402
import reference  # noqa: E402

GPUS = [d for d in jax.devices() if d.platform == "gpu"]
if not GPUS:
    pytest.skip("no GPU visible to JAX (run on a GPU machine)", allow_module_level=True)
if not ringattn.built_with_cuda():
    pytest.skip("this build of ringattn has no CUDA back end", allow_module_level=True)

TOL = 3e-2  # bf16 inputs, f32 accumulation, relative to the largest entry


def close(got, want, tol=TOL):
    got = np.asarray(got, dtype=np.float64)
    err = np.abs(got - want).max() / max(1.0, np.abs(want).max())
    assert err <= tol, f"max error {err:.3g} > {tol:.3g}"


def test_jax_gpu_arrays_in_and_out():
    rng = np.random.default_rng(0)
    shapes = [(2, 45, 8, 64), (2, 77, 2, 64), (2, 77, 2, 64), (2, 45, 8, 64)]
    q, k, v, do = (jax.device_put(jnp.asarray(rng.standard_normal(s), dtype=jnp.bfloat16), GPUS[0]) for s in shapes)
    o, lse = ringattn.attention(q, k, v, causal=True, return_lse=True)
    assert isinstance(o, jax.Array) and o.devices() == {GPUS[0]} and o.dtype == jnp.bfloat16
    dq, dk, dv = ringattn.attention_backward(q, k, v, o, lse, do, causal=True)
    assert all(isinstance(x, jax.Array) and x.devices() == {GPUS[0]} for x in (dq, dk, dv))
    host = [np.asarray(x.astype(jnp.float32), dtype=np.float64) for x in (q, k, v, do)]
    ref_o, ref_lse, _ = reference.forward(*host[:3], causal=True)
    ref_dq, ref_dk, ref_dv, _, _ = reference.backward(*host, causal=True)
    close(o.astype(jnp.float32), ref_o)
    close(lse, ref_lse, 1e-2)
    for got, want in ((dq, ref_dq), (dk, ref_dk), (dv, ref_dv)):
        close(got.astype(jnp.float32), want)
