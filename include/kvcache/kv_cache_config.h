#pragma once

//! Forwards to the header's place by layer; kept so that existing includes stay valid.
#include "kvcache/core/kv_cache_config.h"
