from setuptools import find_packages, setup

setup(
    name="onnx_compat",
    version="0.1.0",
    description="Unmodified PyTorch models that export cleanly to ONNX, with proof.",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.9",
    packages=find_packages(include=["onnx_compat", "onnx_compat.*"]),
    py_modules=["onnx_compat_cli"],  # the console script's first module (a Ctrl-C while torch imports)
    install_requires=[
        "torch>=2.0",
        "onnx",
        "onnxruntime",
        "onnxscript",
        "numpy",
        "wrapt",
    ],
    extras_require={
        "test": ["pytest", "pytest-xdist", "hypothesis", "transformers", "conformer", "einops", "einx", "scipy",
                 "sherpa-onnx", "sherpa-onnx-bin", "kaldi-native-fbank", "openvino"],
        "consumers": ["sherpa-onnx", "sherpa-onnx-bin", "kaldi-native-fbank", "openvino"],
    },
    entry_points={"console_scripts": ["onnx-compat=onnx_compat_cli:command"]},
)
