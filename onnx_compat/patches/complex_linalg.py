"""Complex linear algebra: solves and inverses as the real system of twice the order; the rest refused.

Dereverberation and beamforming solve one small complex system per frequency bin (nara-wpe's
``torch_wpe.wpe_v6``: complex ``matmul`` of delayed STFT frames, then ``torch.linalg.solve(R, P)``,
torch_wpe.py:224; an MVDR beamformer's ``solve(Phi_n, Phi_s)`` or ``inverse``). While exporting, complex
tensors travel as real/imaginary pairs (``_complex.py``), and ONNX has no complex type and no solver;
onnx_compat writes real solves of a static order (``linalg.py``). So:

- ``torch.linalg.solve`` of a pair, ``A x = b`` with ``A`` of a static order ``n``, is the real system
  ``[[Re A, -Im A], [Im A, Re A]] [Re x; Im x] = [Re b; Im b]`` of order ``2n`` (the same solution: the
  block form is the complex product written with real numbers), solved by ``linalg.solve`` when ``2n`` is at
  most its ``MAX_ORDER``; ``inverse``/``linalg.inv`` is the solve with the identity on the right;
- any other complex linear algebra (determinants, decompositions, eigenvalues, or a solve of a dynamic or
  larger order) is refused at the model's line with what is missing and the forms that export;
- any other complex call the pairs lack says, when the model's functions on the way to it call complex
  linear algebra further on, where (``complex_sites.further_on``): the user learns of the real blocker at once.
"""
from __future__ import annotations

import torch

from onnx_compat.errors import SpectralError
from onnx_compat.patches import linalg
from onnx_compat.patches._complex import ComplexPair, _parts, op
from onnx_compat.patches._warning_site import frame_site, model_frame_outside_torch
from onnx_compat.patches.complex_sites import EXPORTABLE, LINALG, SOLVED  # SOLVED: the pair forms below


def _refuse(name: str, why: str = "complex linear algebra is missing"):
    site = frame_site(model_frame_outside_torch())
    raise SpectralError(f"{site}: torch {name} of a complex tensor: {why}. While exporting, complex tensors travel "
                        f"as real/imaginary pairs and ONNX has no complex type and no solver, so a complex {name} "
                        f"has no form in the graph; {EXPORTABLE}")


def _refusal(name: str):
    return lambda *args, **kwargs: _refuse(name)


def _order(name: str, a_real: torch.Tensor) -> int:
    """``n`` of the complex ``A [..., n, n]``, refused unless static with ``2n`` at most ``linalg.MAX_ORDER``."""
    n = linalg._order(a_real)
    if n is None or 2 * n > linalg.MAX_ORDER:
        _refuse(name, f"its order is dynamic or above {linalg.MAX_ORDER // 2}, where the real system of twice the "
                      "order is not unrolled")
    return n


def _real_system(a_re: torch.Tensor, a_im) -> torch.Tensor:
    """``[[Re A, -Im A], [Im A, Re A]]``."""
    a_im = torch.zeros_like(a_re) if a_im is None else a_im
    return torch.cat([torch.cat([a_re, -a_im], -1), torch.cat([a_im, a_re], -1)], -2)


@op("linalg_solve")
def _solve(A, B, *, left: bool = True, out=None) -> ComplexPair:
    if not left or out is not None:
        _refuse("linalg_solve", "left=False or out= has no pair form")
    (a_re, a_im), (b_re, b_im) = _parts(A), _parts(B)
    n = _order("linalg_solve", a_re)
    axis = -1 if linalg._is_vector(a_re, b_re) else -2  # the rows of b: its last dim for a vector
    b_im = torch.zeros_like(b_re) if b_im is None else b_im
    x = linalg.solve(_real_system(a_re, a_im), torch.cat([b_re, b_im], axis))
    return ComplexPair(x.narrow(axis, 0, n), x.narrow(axis, n, n))


@op("linalg_inv", "inverse")
def _inverse(A, *, out=None) -> ComplexPair:
    a_re, _ = _parts(A)
    n = _order("linalg_inv", a_re)
    eye = torch.eye(n, dtype=a_re.dtype, device=a_re.device).expand(a_re.shape)
    return _solve(A, eye, out=out)


for _name in LINALG:
    if _name not in SOLVED:
        op(_name)(_refusal(_name))
