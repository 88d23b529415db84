"""Peak address space (VmPeak, MiB) and exit status of a command run eight times under an
address-space limit of $LIM MiB, sampled every half millisecond.

    LIM=320 python bench/address_space_peak.py target/release/insitubatch bench STORE --epochs 1
"""
import subprocess, sys, time, os, resource
def run():
    def lim(): resource.setrlimit(resource.RLIMIT_AS, (int(os.environ["LIM"])<<20, int(os.environ["LIM"])<<20))
    p = subprocess.Popen(sys.argv[1:], preexec_fn=lim, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    peak = 0
    while p.poll() is None:
        try:
            for l in open(f"/proc/{p.pid}/status"):
                if l.startswith("VmPeak:"):
                    peak = max(peak, int(l.split()[1]))
        except Exception:
            pass
        time.sleep(0.0005)
    return peak // 1024, p.returncode
print([run() for _ in range(8)])
