#!/usr/bin/env python3
"""Generates a tenon InstanceCatalog for chosen EC2 instance types from the public tables in shared/data.

Shapes (vCPU, memory, GPUs, ENIs) come from moto's copy of DescribeInstanceTypes, zones from
DescribeInstanceTypeOfferings, on-demand prices from the AWS Pricing API table (us-east-1, 2026-07-20).
Allocatable follows the EKS formulas: max pods = ENIs x (IPv4 per ENI - 1) + 2; kube-reserved CPU of 6% of
the first core, 1% of the second, 0.5% of cores 3-4 and 0.25% of the rest; kube-reserved memory of
11 x max pods + 255Mi; a 100Mi eviction threshold.

Spot prices are not in the tables (they move by the minute): the catalog derives them as 42% of the
on-demand price, a stated assumption, which puts g5.2xlarge spot at $0.51 as in the specification.

usage: gen-aws-catalog.py DATA_DIR NAME ZONES TYPE... > catalog.yaml
"""
import csv
import sys

import catalog

SPOT_FRACTION = 0.42


def main():
    data, name, zones, types = sys.argv[1], sys.argv[2], sys.argv[3].split(","), sys.argv[4:]
    shapes = {r["instance_type"]: r for r in csv.DictReader(open(f"{data}/aws-instance-types.csv"))}
    prices = {r["instance_type"]: float(r["usd_per_hour"]) for r in csv.DictReader(open(f"{data}/aws-on-demand-prices.csv"))
              if r["region"] == "us-east-1"}
    offered = {}
    for r in csv.DictReader(open(f"{data}/aws-us-east-1-zones.csv")):
        offered.setdefault(r["instance_type"], set()).add(r["zone"])
    catalog.header("gen-aws-catalog.py",
                   ["On-demand: AWS Pricing API, us-east-1, 2026-07-20. Spot: 42% of on-demand (an assumption)."], name)
    for t in types:
        s = shapes[t]
        cpu, mem_mib = int(s["vcpu"]), int(s["memory_mib"])
        pods = int(s["max_network_interfaces"]) * (int(s["ipv4_per_interface"]) - 1) + 2
        gpus = int(s["gpu_count"] or 0)
        family = t.split(".")[0]
        labels = ["kubernetes.io/arch: amd64", "kubernetes.io/os: linux", f"karpenter.k8s.aws/instance-family: {family}",
                  f"karpenter.k8s.aws/instance-category: {family[0]}", f'karpenter.k8s.aws/instance-cpu: "{cpu}"',
                  f"karpenter.k8s.aws/instance-size: {t.split('.')[1]}",
                  f'karpenter.k8s.aws/instance-generation: "{"".join(c for c in family if c.isdigit())}"',
                  f'karpenter.k8s.aws/instance-memory: "{mem_mib}"']
        if gpus:
            labels += [f'karpenter.k8s.aws/instance-gpu-count: "{gpus}"',
                       f"karpenter.k8s.aws/instance-gpu-name: {s['gpu_name'].lower()}",
                       f"karpenter.k8s.aws/instance-gpu-manufacturer: {s['gpu_manufacturer'].lower()}"]
        od = prices[t]
        offerings = [(z, ct, price) for z in zones if z in offered.get(t, set())
                     for ct, price in (("on-demand", od), ("spot", od * SPOT_FRACTION))]
        catalog.instance_type(t, cpu, f"{mem_mib}Mi", pods, gpus, 11 * pods + 255, labels, offerings)

if __name__ == "__main__":
    main()
