r"""Bytes moved per training step on real GPUs: parameter device against ring all-reduce.

The arithmetic behind BENCHMARKS.md's GPU section, for dense fp32 variables of `B` bytes in
all (B = 4 x parameters) and `N` GPUs:

- Parameter device (dpkeras, CentralStorageStrategy; variables on the host CPU): each GPU
  receives every variable once (B bytes host -> GPU) and sends its gradients back (B bytes
  GPU -> host). Per GPU link: B each way. Through the host: N x B each way, plus the optimizer
  update in host memory.
- Ring all-reduce (MirroredStrategy with NCCL): each GPU sends and receives 2 (N - 1) / N x B
  bytes to and from its ring neighbours, over NVLink when present, else PCIe (peer to peer or
  through the host). Nothing goes through the host when peer-to-peer works.

    python -m benchmarks.pcie --params=25.6e6 --gpus=2,4,8        # ResNet-50
    python -m benchmarks.pcie --params=345e6 --pcie_gbps=25       # BERT-large, PCIe 4.0
"""

from absl import app, flags

__all__ = ["parameter_device_bytes", "allreduce_bytes", "table"]

flags.DEFINE_float("params", 25.6e6, "Number of (dense, trained) parameters.")
flags.DEFINE_list("gpus", ["2", "4", "8"], "Comma-separated GPU counts.")
flags.DEFINE_integer("bytes_per_param", 4, "Bytes per parameter and per gradient (fp32: 4).")
flags.DEFINE_float(
    "pcie_gbps",
    12.0,
    "Effective PCIe bandwidth per direction per x16 link, GB/s (3.0: ~12, 4.0: ~25, 5.0: ~50).",
)
flags.DEFINE_float(
    "nvlink_gbps",
    150.0,
    "Effective NVLink bandwidth per direction per GPU, GB/s (V100: ~150, A100: ~300, H100: ~450).",
)


def parameter_device_bytes(params, gpus, bytes_per_param=4):
    """`(per_gpu_each_way, host_each_way)` bytes per step with variables on the host."""
    total = params * bytes_per_param
    return total, gpus * total


def allreduce_bytes(params, gpus, bytes_per_param=4):
    """Bytes each GPU sends (and receives) per step in a ring all-reduce of the gradients."""
    total = params * bytes_per_param
    return 2 * (gpus - 1) / gpus * total


def _mb(nbytes):
    mb = nbytes / 1e6
    return f"{mb:.2f}" if mb < 10 else f"{mb:.1f}" if mb < 100 else f"{mb:.0f}"


def table(params, gpus_list, bytes_per_param=4, pcie_gbps=12.0, nvlink_gbps=150.0):
    """Markdown lines: bytes and lower-bound milliseconds per step for each GPU count."""
    gb = 1e9
    lines = [
        f"{params / 1e6:g}M parameters x {bytes_per_param} bytes = "
        f"{_mb(params * bytes_per_param)} MB of variables (and of gradients) per step. "
        f"PCIe {pcie_gbps:g} GB/s, NVLink {nvlink_gbps:g} GB/s per direction.",
        "",
        "| GPUs | parameter device: MB each way per GPU link | through the host, MB each way "
        "| ms, own x16 link per GPU | ms, GPUs share one x16 uplink | all-reduce: MB each way "
        "per GPU | ms over PCIe | ms over NVLink |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for n in gpus_list:
        per_gpu, host = parameter_device_bytes(params, n, bytes_per_param)
        ring = allreduce_bytes(params, n, bytes_per_param)
        lines.append(
            f"| {n} | {_mb(per_gpu)} | {_mb(host)} | "
            f"{1e3 * per_gpu / (pcie_gbps * gb):.1f} | {1e3 * host / (pcie_gbps * gb):.1f} | "
            f"{_mb(ring)} | {1e3 * ring / (pcie_gbps * gb):.1f} | "
            f"{1e3 * ring / (nvlink_gbps * gb):.2f} |"
        )
    return lines


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {' '.join(argv[1:])}")
    f = flags.FLAGS
    gpus = [int(g) for g in f.gpus]
    print("\n".join(table(f.params, gpus, f.bytes_per_param, f.pcie_gbps, f.nvlink_gbps)))


if __name__ == "__main__":
    app.run(main)
