#!/usr/bin/env python3
"""NVIDIA's Xid catalog as trainguard reads it, and the attribution rules made
from it.

Source: NVIDIA, "Analyzing Xid Errors with the Xid Catalog" (Ampere and newer
GPUs), https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html :
every Xid 1-172 with its resolution bucket (immediate action). Xids the
catalog marks unused on current GPUs were used by older ones; they keep a
cautious reading.

    python3 rules/catalogs/nvidia_xid.py tsv     # the catalog table (nvidia_xid.tsv)
    python3 rules/catalogs/nvidia_xid.py rules   # the rules, as in rules/attribution.json
"""

import json
import sys

SOURCE = "https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html"
LAST = 172  # the highest Xid in the catalog

BUCKETS = {}


def put(xids, bucket):
    for x in xids:
        BUCKETS[x] = bucket


put(list(range(1, 8)) + [9, 10, 12] + list(range(15, 25)) + list(range(26, 31)) + list(range(33, 37)) +
    [42, 47] + list(range(49, 54)) + list(range(55, 60)) + [61, 65, 73, 81, 87, 90, 91] +
    list(range(111, 119)) + [122, 123, 124, 125, 138], "CONTACT_SUPPORT (unused on current GPUs)")
put([8, 39, 40, 41, 60, 68, 70, 71, 72, 75, 76, 77, 82, 83, 84, 85, 86, 88, 89] + list(range(96, 106)) +
    list(range(126, 136)) + [139], "RESTART_APP")
put([11, 25, 32, 69, 80], "RESTART_APP, investigate CHECK_APP/CUDA")
put([13], "RESTART_APP, WORKFLOW_XID_13 (application fault)")
put([31], "RESTART_APP, WORKFLOW_XID_31 (MMU fault, usually the application)")
put([43], "IGNORE (software-induced fault of the application; GPU healthy)")
put([137], "IGNORE, XID_137_FLOW (illegal NVLink peer access, usually the application)")
put([94], "RESTART_APP (contained memory error)")
put([14, 37, 38, 44, 63, 66, 67, 92, 93, 106, 107, 108, 121, 141, 152, 153, 157, 160, 161], "IGNORE")
put([45], "WORKFLOW_XID_45 (cleanup after the application ended or another Xid)")
put([46, 62, 64, 95, 109, 110, 119, 120, 136, 140, 143, 155, 156, 158], "RESET_GPU")
put([48], "WORKFLOW_XID_48 (double-bit ECC)")
put([54], "CHECK_MECHANICALS")
put([74], "WORKFLOW_NVLINK_ERR")
put(list(range(144, 151)), "WORKFLOW_NVLINK5_ERR")
put([78], "UPDATE_SWFW")
put([79], "RESTART_BM")
put([142], "CONTACT_SUPPORT")
put([151], "RESTART_VM")
put([154], "XID_154 (names the recovery action another Xid needs)")
put([159], "CHECK_UVM")
put([162, 163, 164, 165, 166, 170], "informational (power smoothing, confidential computing)")
put([167, 168, 169, 171, 172], "no bucket yet (PCIe fatal timeout, WPR errors, micro-controller halt, DRAM/SRAM detail of Xid 48)")

# trainguard's reading of each bucket: rule id, category, role, action.
GROUPS = [
    ("gpu-xid-fatal", "gpu_hardware", 96, "cause", "persistent", True, "evict_node", "fatal",
     lambda b: b.split(" ")[0].rstrip(",") in ("RESET_GPU", "RESTART_BM", "WORKFLOW_XID_48", "WORKFLOW_NVLINK_ERR",
                                                "WORKFLOW_NVLINK5_ERR", "CHECK_MECHANICALS") or b.startswith("no bucket"),
     "a GPU fault that needs a GPU reset or a reboot (NVIDIA's Xid catalog): the node's GPU is out until then"),
    ("gpu-xid-contained", "gpu_hardware", 93, "cause", "transient", True, "restart", "fatal",
     lambda b: b.startswith("RESTART_APP (contained"),
     "a contained GPU memory error: the application must restart, the GPU stays usable (reset when convenient)"),
    ("gpu-xid-app", "cuda_software", 63, "cause", "unknown", False, "restart", "",
     lambda b: "CHECK_APP" in b or "WORKFLOW_XID_13" in b or "WORKFLOW_XID_31" in b or "XID_137" in b
     or b.startswith("IGNORE (software") or b in ("UPDATE_SWFW", "CHECK_UVM"),
     "a GPU fault the Xid catalog traces to the application or the CUDA stack (illegal access, bad push buffer)"),
    ("gpu-xid-restart", "gpu_hardware", 60, "cause", "transient", True, "restart", "",
     lambda b: b == "RESTART_APP" or b.startswith("CONTACT_SUPPORT") or b == "RESTART_VM",
     "a GPU engine error the Xid catalog answers by restarting the application; repeats point at the GPU"),
    ("gpu-xid-informational", "gpu_hardware", 18, "symptom", "unknown", True, "restart", "warning",
     lambda b: b == "IGNORE" or b.startswith("informational") or b.startswith("WORKFLOW_XID_45") or b.startswith("XID_154"),
     "an Xid the catalog says needs no action (corrected or handled errors, cleanup after another fault)"),
]


def xid_pattern(numbers):
    alt = "|".join(str(n) for n in sorted(numbers))
    # "Xid (PCI:0000:3b:00): 79, ...", "Xid 48", "XID 48 An uncorrectable...", "Xid (43, pid: 5678)".
    return (r"\bXid\b\s*(?:\((?:PCI:)?[0-9A-Fa-f:.]+\)\s*:?|:)?\s*(?:" + alt + r")\b"
            r"|\bXid\b\s*\(\s*(?:" + alt + r")\s*,")


def rules():
    out, seen = [], set()
    for rid, cat, prio, role, pers, hw, action, scan, pick, desc in GROUPS:
        numbers = [x for x, b in BUCKETS.items() if pick(b) and x not in seen]
        seen.update(numbers)
        r = {"id": rid, "category": cat, "priority": prio, "role": role, "persistence": pers, "hardware": hw,
             "action": action}
        if scan:
            r["scan"] = scan
        r.update({"source": SOURCE + " (rules/catalogs/nvidia_xid.py)", "pattern": xid_pattern(numbers),
                  "description": desc})
        out.append(r)
    assert seen == set(BUCKETS), sorted(set(BUCKETS) - seen)
    # Xids newer than the catalog: a GPU fault of unknown kind.
    out.append({"id": "gpu-xid-newer", "category": "gpu_hardware", "priority": 50, "role": "cause",
                "persistence": "unknown", "hardware": True, "action": "restart", "source": SOURCE,
                "pattern": r"\bXid\b\s*(?:\((?:PCI:)?[0-9A-Fa-f:.]+\)\s*:?|:)?\s*(?:17[3-9]|1[89]\d|[2-9]\d\d|\d{4,})\b",
                "description": "an Xid newer than the catalog trainguard knows: a GPU fault of unknown kind"})
    # Xid 154 spells out the recovery action other Xids need.
    out.append({"id": "gpu-recovery-action", "category": "gpu_hardware", "priority": 95, "role": "cause",
                "persistence": "persistent", "hardware": True, "action": "evict_node", "scan": "fatal",
                "source": SOURCE,
                "pattern": r"GPU recovery action changed from [^\n]* to 0x[0-9A-Fa-f]*[1-9A-Fa-f][0-9A-Fa-f]* "
                           r"\((GPU Reset Required|Node Reboot Required|Drain and Reset)\)",
                "description": "the driver says the GPU needs a reset or the node a reboot (Xid 154)"})
    return out


def expected(xid):
    """The category and action a line with this Xid gets."""
    for rid, cat, prio, role, pers, hw, action, scan, pick, desc in GROUPS:
        if xid in BUCKETS and pick(BUCKETS[xid]):
            return cat, action
    return "gpu_hardware", "restart"


if __name__ == "__main__":
    if sys.argv[1:] == ["tsv"]:
        print("# NVIDIA Xid catalog: Xid, immediate action; trainguard category, action. Source: " + SOURCE)
        for x in sorted(BUCKETS):
            print("%d\t%s\t%s\t%s" % ((x, BUCKETS[x]) + expected(x)))
    elif sys.argv[1:] == ["rules"]:
        for r in rules():
            print("    " + json.dumps(r, ensure_ascii=False) + ",")
    else:
        sys.exit(__doc__)
