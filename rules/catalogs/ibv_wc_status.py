#!/usr/bin/env python3
"""RDMA work-completion statuses (enum ibv_wc_status) and adapter async events
(enum ibv_event_type) with the text libibverbs prints for each, and the
category trainguard gives each.

Source: rdma-core's libibverbs itself. The texts are what its
ibv_wc_status_str() and ibv_event_type_str() return, read through ctypes
from the installed library (Debian's libibverbs1, a dependency of
python3-torch):

    python3 rules/catalogs/ibv_wc_status.py > rules/catalogs/ibv_wc_status.tsv

Categories, from what each status means in the verbs API:
- network: the fabric or the peer's adapter (retries exhausted, bad or no
  response, fatal adapter errors, flushed work after such an error);
- cuda_software: the transport software or its setup asked for something the
  adapter refused (lengths, memory registration and access rights, malformed
  requests): the RDMA stack of NCCL/GPUDirect, not a link;
- "-": not a failure (success; benign async events).
"""

import ctypes
import ctypes.util
import sys

# IBV_WC_* in enum order (rdma-core include/infiniband/verbs.h).
WC = ["SUCCESS", "LOC_LEN_ERR", "LOC_QP_OP_ERR", "LOC_EEC_OP_ERR", "LOC_PROT_ERR", "WR_FLUSH_ERR",
      "MW_BIND_ERR", "BAD_RESP_ERR", "LOC_ACCESS_ERR", "REM_INV_REQ_ERR", "REM_ACCESS_ERR", "REM_OP_ERR",
      "RETRY_EXC_ERR", "RNR_RETRY_EXC_ERR", "LOC_RDD_VIOL_ERR", "REM_INV_RD_REQ_ERR", "REM_ABORT_ERR",
      "INV_EECN_ERR", "INV_EEC_STATE_ERR", "FATAL_ERR", "RESP_TIMEOUT_ERR", "GENERAL_ERR", "TM_ERR",
      "TM_RNDV_INCOMPLETE"]
WC_SOFTWARE = {"LOC_LEN_ERR", "LOC_QP_OP_ERR", "LOC_PROT_ERR", "MW_BIND_ERR", "LOC_ACCESS_ERR",
               "REM_INV_REQ_ERR", "REM_ACCESS_ERR", "TM_ERR", "TM_RNDV_INCOMPLETE"}

# IBV_EVENT_* in enum order.
EVENTS = ["CQ_ERR", "QP_FATAL", "QP_REQ_ERR", "QP_ACCESS_ERR", "COMM_EST", "SQ_DRAINED", "PATH_MIG",
          "PATH_MIG_ERR", "DEVICE_FATAL", "PORT_ACTIVE", "PORT_ERR", "LID_CHANGE", "PKEY_CHANGE", "SM_CHANGE",
          "SRQ_ERR", "SRQ_LIMIT_REACHED", "QP_LAST_WQE_REACHED", "CLIENT_REREGISTER", "GID_CHANGE", "WQ_FATAL"]
EVENT_SOFTWARE = {"QP_REQ_ERR", "QP_ACCESS_ERR"}
EVENT_NETWORK = {"CQ_ERR", "QP_FATAL", "PATH_MIG_ERR", "DEVICE_FATAL", "PORT_ERR", "SRQ_ERR", "WQ_FATAL"}


def main():
    lib = ctypes.CDLL(ctypes.util.find_library("ibverbs") or "libibverbs.so.1")
    lib.ibv_wc_status_str.restype = ctypes.c_char_p
    lib.ibv_event_type_str.restype = ctypes.c_char_p
    print("# kind\tnumber\tname\ttext (libibverbs)\tcategory")
    for n, name in enumerate(WC):
        cat = "-" if name == "SUCCESS" else "cuda_software" if name in WC_SOFTWARE else "network"
        print("wc\t%d\tIBV_WC_%s\t%s\t%s" % (n, name, lib.ibv_wc_status_str(n).decode(), cat))
    for n, name in enumerate(EVENTS):
        cat = "cuda_software" if name in EVENT_SOFTWARE else "network" if name in EVENT_NETWORK else "-"
        print("event\t%d\tIBV_EVENT_%s\t%s\t%s" % (n, name, lib.ibv_event_type_str(n).decode(), cat))


if __name__ == "__main__":
    sys.exit(main())
