#pragma once
#include "static_switch.h"
#include <c10/util/Exception.h>
#undef HEADDIM_SWITCH
#define HEADDIM_SWITCH(HEADDIM, ...)                                              \
  [&] {                                                                           \
    if (HEADDIM > 32 && HEADDIM <= 64) {                                          \
      constexpr static int kHeadDim = 64;                                         \
      return __VA_ARGS__();                                                       \
    } else if (HEADDIM > 96 && HEADDIM <= 128) {                                  \
      constexpr static int kHeadDim = 128;                                        \
      return __VA_ARGS__();                                                       \
    } else {                                                                      \
      TORCH_CHECK(false, "flash_attn_2_cuda (attn-gate trimmed build): head dim ", \
                  HEADDIM, " not compiled; only head dims 33-64 (hdim64 kernel) "  \
                  "and 97-128 (hdim128 kernel) are built");                      \
    }                                                                             \
  }()
