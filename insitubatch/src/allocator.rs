//! mimalloc (the allocator of our binaries and of the C library) under an address-space limit.
//!
//! mimalloc reserves address space in arenas of 1 GiB at a time. Under `ulimit -v` (common on
//! HPC login and batch nodes) such a reservation fails and mimalloc falls back to smaller ones,
//! some of them transiently over-sized for alignment; with several threads allocating at once,
//! the process's address space briefly reaches the limit and a thread that starts then cannot
//! map its stack (`pthread_create` fails with EAGAIN). A run of `insitubatch bench` that peaks at
//! ~190 MiB of address space failed that way in about one start in eight under a 320 MiB limit
//! on a loaded machine. So where the address space is limited, arenas are reserved in eighths of
//! the limit (at least 8 MiB). The first reservation comes with the first allocation, before
//! `main` or as a library loads, so the option is set from a load-time initializer (an
//! `.init_array` entry) as well as when a dataset is built.

// mimalloc's C library is linked through this crate's `mimalloc` dependency.
use mimalloc as _;

unsafe extern "C" {
    fn mi_option_set(option: std::ffi::c_int, value: std::ffi::c_long);
}

/// `mi_option_arena_reserve` in mimalloc 3's `mi_option_e` (its value is in KiB).
const MI_OPTION_ARENA_RESERVE: std::ffi::c_int = 23;

/// Runs as the binary or the shared library is loaded, before anything allocates (an ELF
/// initializer; this library is Linux-only).
#[cfg(target_os = "linux")]
#[used]
#[unsafe(link_section = ".init_array")]
static FIT_AT_LOAD: extern "C" fn() = fit_at_load;

#[cfg(target_os = "linux")]
extern "C" fn fit_at_load() {
    fit_to_address_space();
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
