#!/usr/bin/env python3
"""The CUDA runtime's own text for every cudaError_t, as cudaGetErrorString()
returns it and PyTorch prints it ("RuntimeError: CUDA error: <text>"), with
the category trainguard gives each (the same as the name's, see
cuda_errors.py).

Source: the installed CUDA toolkit's libcudart, through ctypes (no GPU is
needed to ask a library for its error strings):

    python3 rules/catalogs/cuda_error_strings.py /usr/local/cuda/lib64/libcudart.so > rules/catalogs/cuda_error_strings.tsv
    python3 rules/catalogs/cuda_error_strings.py --pattern rules/catalogs/cuda_error_strings.tsv

The second form prints the RE2 alternation of the cuda_software texts that
the rule cuda-error-text in rules/attribution.json carries.
"""

import ctypes
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cuda_errors import category  # noqa: E402


def rows(libcudart):
    lib = ctypes.CDLL(libcudart)
    lib.cudaGetErrorName.restype = ctypes.c_char_p
    lib.cudaGetErrorString.restype = ctypes.c_char_p
    out = []
    for number in range(1, 1000):  # 0 is cudaSuccess
        name = lib.cudaGetErrorName(number).decode()
        if name == "cudaErrorUnknown" and number != 999 or "unrecognized" in name:
            continue  # a number the library does not define
        out.append((number, name, lib.cudaGetErrorString(number).decode()))
    return out


def pattern(tsv):
    texts = []
    with open(tsv) as f:
        for line in f:
            if line.startswith("#") or not line.strip():
                continue
            number, name, text, cat = line.rstrip("\n").split("\t")
            if cat == "cuda_software":
                texts.append(re.escape(text).replace("\\ ", " "))
    return "|".join(sorted(set(texts), key=lambda t: (-len(t), t)))


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--pattern":
        print(pattern(sys.argv[2]))
    elif len(sys.argv) == 2:
        print("# number, cudaError_t name, cudaGetErrorString text, trainguard category. "
              "Source: the CUDA toolkit's libcudart")
        for number, name, text in rows(sys.argv[1]):
            print("%d\t%s\t%s\t%s" % (number, name, text, category(name)))
    else:
        sys.exit(__doc__)
