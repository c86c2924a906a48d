// Host stand-in for <cuda_bf16.h> (see emu.h).
#pragma once
#include "emu.h"
