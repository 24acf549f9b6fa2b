#!/usr/bin/env python3
"""The CUDA runtime's cudaError_t and the driver's CUresult names, as the
toolkit's headers define them, with the category trainguard gives each.

Source: the CUDA toolkit's include/driver_types.h (enum cudaError) and
include/cuda.h (enum cudaError_enum), read from an installed toolkit:

    python3 rules/catalogs/cuda_errors.py /usr/local/cuda/include > rules/catalogs/cuda_errors.tsv
"""

import os
import re
import sys

HARDWARE = {"cudaErrorECCUncorrectable", "CUDA_ERROR_ECC_UNCORRECTABLE", "cudaErrorNvlinkUncorrectable",
            "CUDA_ERROR_NVLINK_UNCORRECTABLE", "cudaErrorContained", "CUDA_ERROR_CONTAINED"}
OOM = {"cudaErrorMemoryAllocation", "CUDA_ERROR_OUT_OF_MEMORY"}
USER = {"cudaErrorAssert", "CUDA_ERROR_ASSERT"}
LAUNCH_FAILURE = {"cudaErrorLaunchFailure", "CUDA_ERROR_LAUNCH_FAILED",
                  "cudaErrorPriorLaunchFailure"}  # the gpu-launch-failure rule


def category(name):
    if name in HARDWARE or name in LAUNCH_FAILURE:
        return "gpu_hardware"
    if name in OOM:
        return "oom"
    if name in USER:
        return "user_code"
    return "cuda_software"


def names(include_dir):
    found = []
    for header, pattern in (("driver_types.h", r"\b(cudaError[A-Z]\w*)\s*=\s*(\d+)"),
                            ("cuda.h", r"\b(CUDA_ERROR_[A-Z0-9_]+)\s*=\s*(\d+)")):
        with open(os.path.join(include_dir, header)) as f:
            for name, number in re.findall(pattern, f.read()):
                if name != "cudaErrorApiFailureBase":
                    found.append((name, int(number)))
    return sorted(set(found))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    print("# cudaError_t / CUresult name, number, trainguard category. Source: the CUDA toolkit's "
          "driver_types.h and cuda.h")
    for name, number in names(sys.argv[1]):
        print("%s\t%d\t%s" % (name, number, category(name)))
