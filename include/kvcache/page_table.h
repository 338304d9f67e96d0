#pragma once

//! Forwards to the header's place by layer; kept so that existing includes stay valid.
#include "kvcache/paging/page_table.h"
