#pragma once

// The tests' own model of the PageManager contract (kvcache/paging/page_manager.h), written from the header's text
// without the library's code. The class and how it keeps its state are in page_manager_model_class.h; its calls are
// defined one concern a header, all included here:
// - page_manager_model_pages.h: counts, hashes, the cache by hash, taking, releasing and evicting pages;
// - page_manager_model_sequences.h: create(), adoptPrefix(), step(), fork(), free() and adoptRun();
// - page_manager_model_cuts.h: a hybrid cache's cuts, made, anchoring and dropped;
// - page_manager_model_retention.h: retention priorities and their durations.

#include "support/page_manager_model_class.h"
#include "support/page_manager_model_cuts.h"
#include "support/page_manager_model_pages.h"
#include "support/page_manager_model_retention.h"
#include "support/page_manager_model_sequences.h"
