#!/usr/bin/env python3
"""Generates a tenon InstanceCatalog of common Azure VM sizes from the public price table in shared/data.

Prices: on-demand USD/hour from azure-on-demand-prices.csv (Azure/karpenter-provider-azure, generated
2026-06-18), for one region. Spot prices are not in the table (they come from the Azure retail prices API
and move): this catalog states them as the on-demand price times SPOT_SHARE, a documented assumption, not a
quote. Shapes: the VM sizes' published vCPU, memory and GPUs (Azure VM size documentation), in SHAPES below;
sizes with a fraction of a GPU (NVadsA10 v5 below 36 vCPU) are left out, as the device plugin does not
expose them as whole GPUs. Allocatable follows AKS's reservations (Kubernetes 1.29 and later): kube-reserved
CPU of 60m for the first core, 40m for the second, 20m each for cores 3-4 and 10m for each core after (AKS's
table: 2 cores 100m, 4 cores 140m, 64 cores 740m); kube-reserved memory
of 20 MiB per pod plus 50 MiB, at most 25% of memory; a 100Mi eviction threshold; MAX_PODS pods per node
(Azure CNI overlay's default). Every size is offered in every zone given on the command line: zonal
availability is not in the tables, so that is an assumption of the catalog.

usage: gen-azure-catalog.py DATA_DIR NAME REGION ZONES SIZE... > catalog.yaml
"""
import csv
import re
import sys

import catalog

# VM size: (vCPU, memory GiB, GPUs, GPU name)
SHAPES = {
    "Standard_D2s_v5": (2, 8, 0, None),
    "Standard_D4s_v5": (4, 16, 0, None),
    "Standard_D8s_v5": (8, 32, 0, None),
    "Standard_D16s_v5": (16, 64, 0, None),
    "Standard_D32s_v5": (32, 128, 0, None),
    "Standard_E4s_v5": (4, 32, 0, None),
    "Standard_E8s_v5": (8, 64, 0, None),
    "Standard_E16s_v5": (16, 128, 0, None),
    "Standard_F4s_v2": (4, 8, 0, None),
    "Standard_F8s_v2": (8, 16, 0, None),
    "Standard_F16s_v2": (16, 32, 0, None),
    "Standard_NC4as_T4_v3": (4, 28, 1, "T4"),
    "Standard_NC8as_T4_v3": (8, 56, 1, "T4"),
    "Standard_NC16as_T4_v3": (16, 110, 1, "T4"),
    "Standard_NC64as_T4_v3": (64, 440, 4, "T4"),
    "Standard_NV36ads_A10_v5": (36, 440, 1, "A10"),
    "Standard_NV72ads_A10_v5": (72, 880, 2, "A10"),
    "Standard_NC24ads_A100_v4": (24, 220, 1, "A100"),
    "Standard_NC48ads_A100_v4": (48, 440, 2, "A100"),
    "Standard_NC96ads_A100_v4": (96, 880, 4, "A100"),
    "Standard_ND96asr_v4": (96, 900, 8, "A100"),
    "Standard_ND96amsr_A100_v4": (96, 1900, 8, "A100"),
}
MAX_PODS = 250
SPOT_SHARE = 0.35


def aks_reserved_cpu_millis(cpu):
    """AKS's kube-reserved CPU for `cpu` cores (its node resource reservations table)."""
    return sum(60 if core == 0 else 40 if core == 1 else 20 if core < 4 else 10 for core in range(cpu))


def family_and_version(size):
    """`Standard_NC24ads_A100_v4` -> ("N", "4"): the family letter (the first of the name, as
    karpenter-provider-azure's `sku-family` has it), and the version."""
    body = size.removeprefix("Standard_")
    family = re.match(r"[A-Z]", body).group(0)
    version = re.search(r"_v(\d+)$", body)
    return family, version.group(1) if version else "1"


def main():
    data, name, region, zones, sizes = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4].split(","), sys.argv[5:]
    prices = {
        r["vm_size"]: float(r["usd_per_hour"])
        for r in csv.DictReader(open(f"{data}/azure-on-demand-prices.csv"))
        if r["region"] == region
    }
    catalog.header("gen-azure-catalog.py", [
        f"Prices: {region} on-demand, Azure/karpenter-provider-azure, 2026-06-18. Spot is NOT a quote: it is",
        f"stated as {SPOT_SHARE:.0%} of on-demand (an assumed discount); bring your own catalog for real prices.",
        "Shapes: published VM size specifications; every size offered in every zone (an assumption).",
    ], name)
    for size in sizes:
        cpu, gib, gpus, gpu = SHAPES[size]
        on_demand = prices[size]
        family, version = family_and_version(size)
        labels = [
            "kubernetes.io/arch: amd64",
            "kubernetes.io/os: linux",
            f"karpenter.azure.com/sku-family: {family}",
            f'karpenter.azure.com/sku-cpu: "{cpu}"',
            f'karpenter.azure.com/sku-memory: "{gib * 1024}"',
            f'karpenter.azure.com/sku-version: "{version}"',
        ]
        if gpus:
            labels += [
                f"karpenter.azure.com/sku-gpu-name: {gpu}",
                "karpenter.azure.com/sku-gpu-manufacturer: nvidia",
                f'karpenter.azure.com/sku-gpu-count: "{gpus}"',
            ]
        offerings = [(z, ct, price) for z in zones
                     for ct, price in (("on-demand", on_demand), ("spot", on_demand * SPOT_SHARE))]
        memory_mib = min(20 * MAX_PODS + 50, gib * 1024 // 4)
        catalog.instance_type(size, cpu, f"{gib}Gi", MAX_PODS, gpus, memory_mib, labels, offerings,
                              reserved_cpu=aks_reserved_cpu_millis(cpu))

if __name__ == "__main__":
    main()
