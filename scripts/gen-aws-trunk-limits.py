#!/usr/bin/env python3
"""Writes providers/data/aws-trunk-limits.csv: the branch network interfaces (`vpc.amazonaws.com/pod-eni`,
security groups for pods) of every EC2 instance type that supports ENI trunking.

EC2's API does not describe trunking; the table AWS publishes is the VPC resource controller's
(github.com/aws/amazon-vpc-resource-controller-k8s, Apache-2.0, `pkg/aws/vpc/limits.go`), which Karpenter
reads too. This script fetches that module through the Go module proxy (`go mod download`, into a
scratch GOPATH outside the repository) and keeps only the two facts tenon needs, as CSV:

    scripts/gen-aws-trunk-limits.py [VERSION]     # default: the version below
"""
import csv
import json
import os
import re
import subprocess
import sys
import tempfile

MODULE = "github.com/aws/amazon-vpc-resource-controller-k8s"
VERSION = "v1.8.2"
OUT = os.path.join(os.path.dirname(__file__), "..", "providers", "data", "aws-trunk-limits.csv")


def limits_go(version):
    scratch = os.path.join(tempfile.gettempdir(), "tenon-gen-trunk-limits")
    env = dict(os.environ, GOPATH=os.path.join(scratch, "gopath"), GOFLAGS="-mod=mod")
    out = subprocess.run(["go", "mod", "download", "-json", f"{MODULE}@{version}"],
                         check=True, capture_output=True, text=True, env=env, cwd=scratch if os.path.isdir(scratch) else None)
    info = json.loads(out.stdout)
    with open(os.path.join(info["Dir"], "pkg", "aws", "vpc", "limits.go")) as f:
        return f.read(), info["Version"]


def main():
    version = sys.argv[1] if len(sys.argv) > 1 else VERSION
    os.makedirs(os.path.join(tempfile.gettempdir(), "tenon-gen-trunk-limits"), exist_ok=True)
    text, version = limits_go(version)
    generated = re.search(r"generated at (\S+)", text)
    rows = []
    for m in re.finditer(r'^\t"([a-z0-9.\-]+)": \{(.*?)^\t\},', text, re.S | re.M):
        name, body = m.group(1), m.group(2)
        trunking = re.search(r"IsTrunkingCompatible:\s*(true|false)", body)
        branch = re.search(r"BranchInterface:\s*(\d+)", body)
        if trunking and trunking.group(1) == "true" and branch and int(branch.group(1)) > 0:
            rows.append((name, int(branch.group(1))))
    if len(rows) < 500:
        sys.exit(f"only {len(rows)} trunking types parsed from {MODULE}@{version}: the file's layout changed")
    rows.sort()
    with open(OUT, "w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(["instance_type", "branch_interfaces"])
        w.writerows(rows)
    stamp = generated.group(1) if generated else "unknown"
    print(f"wrote {len(rows)} types from {MODULE}@{version} (its table generated {stamp})")


if __name__ == "__main__":
    main()
