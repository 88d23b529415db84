//! mimalloc (the allocator of our binaries and of the C library): small pages for its memory,
//! and arenas sized to an address-space limit.
//!
//! **Small pages.** mimalloc asks the kernel for transparent huge pages on every arena it maps
//! (`madvise(MADV_HUGEPAGE)`). A fresh process's first epoch touches all the memory the pass
//! keeps (at 16 samples per chunk the automatic budget holds the whole split: ~270 MB for the
//! harness's 512-sample store), and on a virtual machine that reports free memory to its host a
//! huge page's first touch is slow: it is most likely a reported block, so its zeroing faults
//! the host in as well (`clear_page_erms` was 68 % of a fresh process's samples). With 4 KiB pages the
//! same epoch ran 2–3× faster at 8 to 32 samples per chunk and peaked 14–63 MiB lower, for
//! resident epochs ~3 % slower in a warm process (`docs/benchmarks.md`, "Small pages for a
//! fresh process"). So the library stops mimalloc's advice for its own arenas, unless
//! `MIMALLOC_ALLOW_THP` is set. It does this after mimalloc has initialized, so mimalloc never
//! calls `prctl(PR_SET_THP_DISABLE)`, which would take huge pages from the whole process (a
//! simulation code or torch beside us); a system whose THP mode is `always` still gives huge
//! pages to everyone.
//!
//! **Arenas under an address-space limit.** mimalloc reserves address space in arenas of 1 GiB
//! at a time. Under `ulimit -v` (common on HPC login and batch nodes) such a reservation fails
//! and mimalloc falls back to smaller ones, some of them transiently over-sized for alignment;
//! with several threads allocating at once, the process's address space briefly reaches the
//! limit and a thread that starts then cannot map its stack (`pthread_create` fails with
//! EAGAIN). A run of `insitubatch bench` that peaks at ~190 MiB of address space failed that way
//! in about one start in eight under a 320 MiB limit on a loaded machine. So where the address
//! space is limited, arenas are reserved in eighths of the limit (at least 8 MiB). The first
//! reservation comes with the first allocation, before `main` or as a library loads, so the
//! option is set from a load-time initializer (an `.init_array` entry) as well as when a dataset
//! is built.

// mimalloc's C library is linked through this crate's `mimalloc` dependency.
use mimalloc as _;

unsafe extern "C" {
    fn mi_option_set(option: std::ffi::c_int, value: std::ffi::c_long);
    fn mi_process_init();
}

/// `mi_option_arena_reserve` in mimalloc 3's `mi_option_e` (its value is in KiB).
const MI_OPTION_ARENA_RESERVE: std::ffi::c_int = 23;
/// `mi_option_allow_thp` in mimalloc 3's `mi_option_e`.
const MI_OPTION_ALLOW_THP: std::ffi::c_int = 43;
/// The environment variable through which mimalloc reads `allow_thp`: set, it wins.
const ALLOW_THP_VAR: &std::ffi::CStr = c"MIMALLOC_ALLOW_THP";

/// Runs as the binary or the shared library is loaded, before anything allocates (an ELF
/// initializer; this library is Linux-only).
#[cfg(target_os = "linux")]
#[used]
#[unsafe(link_section = ".init_array")]
static FIT_AT_LOAD: extern "C" fn() = fit_at_load;

#[cfg(target_os = "linux")]
extern "C" fn fit_at_load() {
    small_pages_unless_asked();
    fit_to_address_space();
}

/// Stops mimalloc advising huge pages for the arenas it maps from now on, unless the user set
/// `MIMALLOC_ALLOW_THP`. Runs from the load-time initializer, before anything allocates: it must
/// not allocate itself, since the first allocation maps the first arena.
///
/// mimalloc decides at its process initialization whether to disable huge pages for the whole
/// process (it does when `allow_thp` is 0 then), and with gcc its initializer has no priority,
/// so ours may run first (it does, in the C library). So this initializes mimalloc first
/// (`mi_process_init` runs once; mimalloc's own initializer then finds it done), and only then
/// sets the option.
#[cfg(target_os = "linux")]
fn small_pages_unless_asked() {
    // SAFETY: `mi_process_init` may be called at any time and initializes once. `getenv` with a
    // NUL-terminated name; the result is only compared with null. `mi_option_set` sets one of
    // mimalloc's options, and 0 is a valid value for this one.
    unsafe {
        mi_process_init();
        if libc::getenv(ALLOW_THP_VAR.as_ptr()).is_null() {
            mi_option_set(MI_OPTION_ALLOW_THP, 0);
        }
    }
}

/// Sizes mimalloc's arena reservations to the process's address-space limit, once; nothing
/// without a limit.
pub fn fit_to_address_space() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        if let Some(kib) = insitubatch_actors::planner::address_space_limit().map(arena_reserve_kib)
        {
            // SAFETY: sets one of mimalloc's options; any value is valid for this one.
            unsafe { mi_option_set(MI_OPTION_ARENA_RESERVE, kib) };
        }
    });
}

/// mimalloc's arena reservation under an address-space limit of `limit` bytes, in KiB: an
/// eighth of the limit, between 8 MiB and mimalloc's own 1 GiB.
fn arena_reserve_kib(limit: u64) -> std::ffi::c_long {
    ((limit / 8).clamp(8 << 20, 1 << 30) / 1024) as std::ffi::c_long
}

#[cfg(test)]
mod tests {
    use super::*;

    // The unit tests allocate through mimalloc, as our binaries and the C library do.
    #[global_allocator]
    static MIMALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

    unsafe extern "C" {
        fn mi_option_get(option: std::ffi::c_int) -> std::ffi::c_long;
    }

    /// Whether mimalloc advises transparent huge pages for arenas it maps from now on.
    fn huge_pages_advised() -> bool {
        // SAFETY: reads one of mimalloc's options.
        unsafe { mi_option_get(MI_OPTION_ALLOW_THP) != 0 }
    }

    /// The `VmFlags` of the mapping of /proc/self/smaps that holds `addr`.
    fn vm_flags_at(addr: usize) -> String {
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let mut inside = false;
        for line in smaps.lines() {
            let range = line.split_whitespace().next().unwrap_or("");
            if let Some((lo, hi)) = range.split_once('-')
                && let (Ok(lo), Ok(hi)) =
                    (usize::from_str_radix(lo, 16), usize::from_str_radix(hi, 16))
            {
                inside = (lo..hi).contains(&addr);
            } else if inside && let Some(flags) = line.strip_prefix("VmFlags:") {
                return flags.trim().to_string();
            }
        }
        panic!("no mapping holds {addr:#x}")
    }

    #[test]
    fn large_buffers_are_not_advised_huge_pages_unless_the_user_asks() {
        if std::env::var_os("MIMALLOC_ALLOW_THP").is_some() {
            return; // the user's choice wins; nothing of ours to check
        }
        assert!(!huge_pages_advised(), "the load-time initializer ran");
        // A decoded chunk's size: mimalloc maps it in an arena (or on its own).
        let buf = vec![1u8; 16 << 20];
        let flags = vm_flags_at(buf.as_ptr() as usize + (8 << 20));
        assert!(
            !flags.split_whitespace().any(|f| f == "hg"),
            "a 16 MiB buffer's mapping is advised huge pages: VmFlags {flags}"
        );
        assert!(flags.split_whitespace().any(|f| f == "wr"), "{flags}");
    }

    #[test]
    fn arenas_are_an_eighth_of_the_limit_within_mimallocs_bounds() {
        assert_eq!(arena_reserve_kib(320 << 20), 40 << 10);
        assert_eq!(arena_reserve_kib(32 << 20), 8 << 10, "at least 8 MiB");
        assert_eq!(
            arena_reserve_kib(64 << 30),
            1 << 20,
            "at most mimalloc's 1 GiB"
        );
    }
}
