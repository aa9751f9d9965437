"""Link ONNX Runtime's shared library from an installed registry package into a folder, for the native build.

``python find_ort_library.py onnxruntime|sherpa-onnx FOLDER``: FOLDER gets ``libonnxruntime.so`` (the link-time
name) and the library's SONAME, both links to the package's file.
"""
import glob
import importlib
import os
import subprocess
import sys

PACKAGES = {"onnxruntime": ("onnxruntime", "capi/libonnxruntime.so*"), "sherpa-onnx": ("sherpa_onnx", "lib/libonnxruntime.so*")}


def main(package: str, folder: str) -> None:
    module, pattern = PACKAGES[package]
    root = os.path.dirname(importlib.import_module(module).__file__)
    found = sorted(glob.glob(os.path.join(root, pattern)), key=len)
    if not found:
        sys.exit(f"{package} installed at {root} ships no libonnxruntime.so")
    library = os.path.realpath(found[-1])
    soname = subprocess.run(["objdump", "-p", library], capture_output=True, text=True).stdout
    names = {"libonnxruntime.so"} | {line.split()[1] for line in soname.splitlines() if "SONAME" in line}
    for name in names:
        link = os.path.join(folder, name)
        if os.path.lexists(link):
            os.remove(link)
        os.symlink(library, link)
    print(f"{package}: {library} as {sorted(names)}")


if __name__ == "__main__":
    main(*sys.argv[1:])
