// Prefix-cache statistics (PageManager::stats, tenantStats, resetStats) and the tenants they are kept for: one per salt
// root, up to kMAX_TENANTS, the rest counted together.
#include "paging/page_manager/page_manager_state.h"

#include <utility>

namespace kvcache::rt
{

PageManagerStats PageManager::stats() const noexcept
{
    State const& s = *mState;
    return PageManagerStats{s.prefixQueryTokens, s.prefixHitTokens, s.prefix.evictedPages(), s.copyOnWritePages,
        s.checkpoints.saved, s.checkpoints.restored, s.checkpoints.dropped};
}

std::vector<PrefixTenantStats> PageManager::tenantStats() const
{
    State const& s = *mState;
    std::vector<PrefixTenantStats> result;
    result.reserve(s.tenants.size() + 1);
    for (State::Tenant const& tenant : s.tenants)
    {
        result.push_back(tenant.stats);
    }
    if (s.tenants.size() == static_cast<size_t>(kMAX_TENANTS))
    {
        result.push_back(s.otherTenant);
    }
    return result;
}

int32_t PageManager::State::tenantOf(PageHash root, void const* salt, size_t saltBytes)
{
    for (size_t t = 0; t < tenants.size(); ++t)
    {
        if (tenants[t].root == root)
        {
            return static_cast<int32_t>(t);
        }
    }
    if (tenants.size() == static_cast<size_t>(kMAX_TENANTS))
    {
        return -1;
    }
    Tenant tenant;
    tenant.root = root;
    auto const* bytes = static_cast<uint8_t const*>(salt);
    tenant.stats.salt.assign(bytes, bytes + saltBytes);
    tenants.push_back(std::move(tenant));
    return static_cast<int32_t>(tenants.size() - 1);
}

void PageManager::resetStats() noexcept
{
    for (State::Tenant& tenant : mState->tenants)
    {
        std::vector<uint8_t> salt = std::move(tenant.stats.salt);
        tenant.stats = PrefixTenantStats{};
        tenant.stats.salt = std::move(salt);
    }
    mState->otherTenant = PrefixTenantStats{};
    mState->otherTenant.other = true;
    mState->prefixQueryTokens = 0;
    mState->prefixHitTokens = 0;
    mState->copyOnWritePages = 0;
    mState->checkpoints.saved = 0;
    mState->checkpoints.restored = 0;
    mState->checkpoints.dropped = 0;
    mState->prefix.resetEvictedPages();
}

} // namespace kvcache::rt
