// Device temporaries kept between calls by layers above the runtime (attention/cuda's summaries of named masks).
// A kept block pins its whole chunk of the cache's pool, so handing the cache back (release_device_cache, or an
// allocation that failed) first asks every keeper to drop what it keeps: what is kept is only ever a shortcut.
#pragma once

namespace ra {

// Registers `drop`, which lets go of everything its keeper holds (safe to call at any time, from any thread, also
// while the keeper is inside an allocation of its own). CUDA builds only.
void drop_when_releasing_the_cache(void (*drop)());

// Calls every registered drop (the device cache's release does, first).
void drop_kept_temporaries();

}  // namespace ra
