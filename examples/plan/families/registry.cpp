#include "families/family.h"

namespace kvcache::plan::families
{

// One line a family, in the order their rules are tried: the first family whose rule applies to a config decides.
// Families that only name layer kinds come first, in the order the reader's messages list those kinds.
#define KVCACHE_PLAN_FAMILIES(FAMILY)                                                                                  \
    FAMILY(qwenNext)                                                                                                   \
    FAMILY(jamba)                                                                                                      \
    FAMILY(lfm2)                                                                                                       \
    FAMILY(mamba2)                                                                                                     \
    FAMILY(nemotronH)                                                                                                  \
    FAMILY(kimiLinear)                                                                                                 \
    FAMILY(recurrentGemma)                                                                                             \
    FAMILY(gemma)                                                                                                      \
    FAMILY(gemma3n)                                                                                                    \
    FAMILY(cohere)                                                                                                     \
    FAMILY(llama)                                                                                                      \
    FAMILY(qwen)                                                                                                       \
    FAMILY(mistral)                                                                                                    \
    FAMILY(deepseek)                                                                                                   \
    FAMILY(falcon)                                                                                                     \
    FAMILY(gpt2)

#define KVCACHE_PLAN_DECLARE_FAMILY(name) ModelFamily name##Family();
KVCACHE_PLAN_FAMILIES(KVCACHE_PLAN_DECLARE_FAMILY)
#undef KVCACHE_PLAN_DECLARE_FAMILY

std::vector<ModelFamily> const& modelFamilies()
{
#define KVCACHE_PLAN_LIST_FAMILY(name) name##Family(),
    static std::vector<ModelFamily> const families = {KVCACHE_PLAN_FAMILIES(KVCACHE_PLAN_LIST_FAMILY)};
#undef KVCACHE_PLAN_LIST_FAMILY
    return families;
}

} // namespace kvcache::plan::families
