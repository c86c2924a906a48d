// Host stand-in for <cuda_runtime.h>: cuda/*.cu compile with g++ against this directory (see emu.h).
#pragma once
#include "emu.h"
