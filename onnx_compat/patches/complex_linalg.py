"""Complex linear algebra, refused at the model's line with what is missing and what would export.

Dereverberation and beamforming solve one small complex system per frequency bin (nara-wpe's
``torch_wpe.wpe_v6``: complex ``matmul`` of delayed STFT frames, then ``torch.linalg.solve(R, P)``,
torch_wpe.py:224). While exporting, complex tensors travel as real/imaginary pairs (``_complex.py``), and
ONNX has no complex type and no solver; onnx_compat writes real solves of a static order (``linalg.py``).
A complex solve, inverse, determinant or decomposition has no pair form here, and without one the error
was "torch linalg_solve: this operation on a complex tensor is not supported", naming neither the line
nor what the model would need.

Two things, both in the ``SpectralError`` the spectral patches raise:

- a complex linear-algebra call is refused with its own message: the model's ``file:line``, that complex
  linear algebra is what is missing, and the form that exports (the real system of twice the order,
  ``[[Re A, -Im A], [Im A, Re A]] [Re x; Im x] = [Re b; Im b]``, which the real solve takes at a static
  order, or the solve done outside the graph);
- any other complex call the pairs lack (nara-wpe stops first at ``x.ndimension()`` on the STFT,
  torch_wpe.py:92) says, when the model's functions on the way to it call complex linear algebra further
  on, where (``further_on``): the user learns of the real blocker at once, not after fixing the first line.
"""
from __future__ import annotations

from onnx_compat.errors import SpectralError
from onnx_compat.patches._complex import op
from onnx_compat.patches._warning_site import frame_site, model_frame_outside_torch
from onnx_compat.patches.complex_sites import EXPORTABLE, LINALG


def _refuse(name: str):
    def refuse(*args, **kwargs):
        site = frame_site(model_frame_outside_torch())
        raise SpectralError(f"{site}: torch {name} of a complex tensor: complex linear algebra is missing. "
                            f"While exporting, complex tensors travel as real/imaginary pairs and ONNX has no "
                            f"complex type and no solver, so a complex {name} has no form in the graph; "
                            f"{EXPORTABLE}")
    return refuse


for _name in LINALG:
    op(_name)(_refuse(_name))
