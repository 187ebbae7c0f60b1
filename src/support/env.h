// Development and test knobs read from the environment (MK_CUDA_*, MK_EMU_*, MK_SERVE_*_MS).
// An unset or empty variable gives the default. Anything else must be a whole decimal number (an
// optional '-', digits, nothing else: no spaces, no "0x", no "1.5") within [lo, hi], or mk::Error
// names the variable, its value and the range. env_flag takes 0 or 1 only.
#pragma once
#include <cstdint>

namespace mk {

int64_t env_int(const char* name, int64_t def, int64_t lo, int64_t hi);
bool env_flag(const char* name, bool def);

}  // namespace mk
