#!/usr/bin/env python3
"""Generates a tenon InstanceCatalog of common GCE machine types from the public price table in shared/data.

Prices: on-demand and spot USD/hour from gcp-prices.csv (cloudpilot-ai/karpenter-provider-gcp initial
prices, 2026-08-03), for one region. Shapes: the machine types' published vCPU, memory and attached GPUs
(Google Cloud machine-family documentation), listed in SHAPES below. Allocatable follows GKE's reservations:
kube-reserved CPU of 6% of the first core, 1% of the second, 0.5% of cores 3-4 and 0.25% of the rest;
memory of 25% of the first 4 GiB, 20% of the next 4, 10% of the next 8, 6% of the next 112 and 2% above;
a 100Mi eviction threshold; 110 pods per node. Every type is offered in every zone given on the command
line: zonal availability is not in the tables, so that is an assumption of the catalog.

usage: gen-gcp-catalog.py DATA_DIR NAME REGION ZONES TYPE... > catalog.yaml
"""
import csv
import sys

import catalog

# machine type: (vCPU, memory GiB, GPUs, GPU model)
SHAPES = {
    "e2-standard-4": (4, 16, 0, None),
    "e2-standard-8": (8, 32, 0, None),
    "n2-standard-4": (4, 16, 0, None),
    "n2-standard-8": (8, 32, 0, None),
    "n2-standard-16": (16, 64, 0, None),
    "c3-standard-8": (8, 32, 0, None),
    "g2-standard-4": (4, 16, 1, "nvidia-l4"),
    "g2-standard-8": (8, 32, 1, "nvidia-l4"),
    "g2-standard-12": (12, 48, 1, "nvidia-l4"),
    "g2-standard-24": (24, 96, 2, "nvidia-l4"),
    "g2-standard-48": (48, 192, 4, "nvidia-l4"),
    "a2-highgpu-1g": (12, 85, 1, "nvidia-tesla-a100"),
    "a2-highgpu-2g": (24, 170, 2, "nvidia-tesla-a100"),
    "a2-highgpu-4g": (48, 340, 4, "nvidia-tesla-a100"),
    "a2-highgpu-8g": (96, 680, 8, "nvidia-tesla-a100"),
}
MAX_PODS = 110


def reserved_memory_mib(gib):
    tiers = [(4, 0.25), (4, 0.20), (8, 0.10), (112, 0.06), (float("inf"), 0.02)]
    left, total = gib, 0.0
    for size, share in tiers:
        take = min(left, size)
        total += take * share
        left -= take
        if left <= 0:
            break
    return int(total * 1024)


def main():
    data, name, region, zones, types = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4].split(","), sys.argv[5:]
    prices = {r["machine_type"]: r for r in csv.DictReader(open(f"{data}/gcp-prices.csv")) if r["region"] == region}
    catalog.header("gen-gcp-catalog.py", [
        f"Prices: {region} on-demand and spot, cloudpilot-ai/karpenter-provider-gcp, 2026-08-03.",
        "Shapes: published machine-type specifications; every type offered in every zone (an assumption).",
    ], name)
    for t in types:
        cpu, gib, gpus, model = SHAPES[t]
        p = prices[t]
        family = t.split("-")[0]
        labels = ["kubernetes.io/arch: amd64", "kubernetes.io/os: linux", f"cloud.google.com/machine-family: {family}"]
        if gpus:
            labels += [f"cloud.google.com/gke-accelerator: {model}", f'cloud.google.com/gke-accelerator-count: "{gpus}"']
        offerings = [(z, ct, float(p[column])) for z in zones
                     for ct, column in (("on-demand", "on_demand_usd_per_hour"), ("spot", "spot_usd_per_hour"))]
        catalog.instance_type(t, cpu, f"{gib}Gi", MAX_PODS, gpus, reserved_memory_mib(gib), labels, offerings)

if __name__ == "__main__":
    main()
