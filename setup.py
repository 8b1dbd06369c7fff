"""The one compiled part: the safetensors header scan (ckptscope/formats/safetensors/_scan.c).

``optional=True``: where no C compiler (or no Python headers) is found, the install goes on without it
and ckptscope reads every header with its Python parser (the same results, slower on huge headers).
Everything else is in pyproject.toml.
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("ckptscope.formats.safetensors._scan", ["ckptscope/formats/safetensors/_scan.c"],
                             optional=True, extra_compile_args=["-O2"])])
