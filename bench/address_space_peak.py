"""Peak address space (VmPeak, MiB) and exit status of a command run eight times under an
address-space limit of $LIM MiB (`ulimit -v`), sampled every half millisecond.

    LIM=320 python bench/address_space_peak.py target/release/insitubatch bench STORE --epochs 1
"""

import os
import resource
import subprocess
import sys
import time


def vm_peak_mib(pid: int) -> int:
    """The process's VmPeak so far, or 0 once it has gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmPeak:"):
                    return int(line.split()[1]) // 1024
    except (FileNotFoundError, ProcessLookupError):
        pass
    return 0


def run(command: list[str], limit_mib: int) -> tuple[int, int]:
    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (limit_mib << 20, limit_mib << 20))

    p = subprocess.Popen(command, preexec_fn=limit, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    peak = 0
    while p.poll() is None:
        peak = max(peak, vm_peak_mib(p.pid))
        time.sleep(0.0005)
    return peak, p.returncode


def main() -> None:
    limit_mib = int(os.environ.get("LIM", "320"))
    runs = [run(sys.argv[1:], limit_mib) for _ in range(8)]
    print(f"under {limit_mib} MiB: (VmPeak MiB, exit status) {runs}")


if __name__ == "__main__":
    main()
