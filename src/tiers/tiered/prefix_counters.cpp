// A prefix cache's counters in one snapshot, and in Prometheus' text exposition format.
#include "kvcache/tiers/prefix_counters.h"

#include "kvcache/core/errors.h"

#include <fmt/format.h>

#include <cctype>
#include <cstdint>

namespace kvcache::rt
{
namespace
{

bool isMetricName(std::string const& name)
{
    if (name.empty())
    {
        return false;
    }
    for (size_t i = 0; i < name.size(); ++i)
    {
        auto const c = static_cast<unsigned char>(name[i]);
        bool const letter = std::isalpha(c) != 0 || c == '_' || c == ':';
        if (!letter && (i == 0 || std::isdigit(c) == 0))
        {
            return false;
        }
    }
    return true;
}

std::string tenantLabel(PrefixTenantStats const& tenant)
{
    if (tenant.other)
    {
        return "other";
    }
    std::string hex;
    for (uint8_t const byte : tenant.salt)
    {
        hex += fmt::format("{:02x}", byte);
    }
    return hex;
}

//! Writes the HELP and TYPE lines of one counter family.
void family(std::string& out, std::string const& name, char const* help)
{
    out += fmt::format("# HELP {} {}\n# TYPE {} counter\n", name, help, name);
}

} // namespace

PrefixCacheCounters snapshotCounters(PageManager const& pages, TieredPrefixCache const* tiered)
{
    PrefixCacheCounters counters;
    counters.device = pages.stats();
    if (tiered != nullptr)
    {
        counters.hasTiers = true;
        counters.tiers = tiered->stats();
    }
    counters.tenants = pages.tenantStats();
    return counters;
}

std::string toPrometheusText(PrefixCacheCounters const& counters, std::string const& prefix)
{
    if (!isMetricName(prefix))
    {
        throw InvalidArgumentError(fmt::format(
            "toPrometheusText: prefix is \"{}\"; it must be a metric name, [a-zA-Z_:][a-zA-Z0-9_:]*", prefix));
    }
    PageManagerStats const& device = counters.device;
    TieredPrefixCacheStats const& tiers = counters.tiers;
    std::string out;
    std::string name = prefix + "_prefix_query_tokens_total";
    family(out, name, "Prompt tokens looked up in the prefix cache.");
    out += fmt::format("{} {}\n", name, device.prefixQueryTokens);
    name = prefix + "_prefix_hit_tokens_total";
    family(out, name, "Prompt tokens found in the prefix cache, by tier.");
    out += fmt::format("{}{{tier=\"device\"}} {}\n", name, device.prefixHitTokens);
    if (counters.hasTiers)
    {
        out += fmt::format("{}{{tier=\"host\"}} {}\n", name, tiers.hostHitTokens - tiers.diskHitTokens);
        out += fmt::format("{}{{tier=\"disk\"}} {}\n", name, tiers.diskHitTokens);
    }
    name = prefix + "_evicted_pages_total";
    family(out, name, "Cached pages whose content was dropped to make room, by tier.");
    out += fmt::format("{}{{tier=\"device\"}} {}\n", name, device.evictedPages);
    if (counters.hasTiers)
    {
        out += fmt::format("{}{{tier=\"host\"}} {}\n", name, tiers.evictedHostPages);
        out += fmt::format("{}{{tier=\"disk\"}} {}\n", name, tiers.evictedDiskPages);
    }
    name = prefix + "_copy_on_write_pages_total";
    family(out, name, "Pages copied because a sequence wrote to a page it shared.");
    out += fmt::format("{} {}\n", name, device.copyOnWritePages);
    if (counters.hasTiers)
    {
        struct Counter
        {
            char const* name;
            char const* help;
            int64_t value;
        };
        for (Counter const& counter :
            {Counter{"offloaded_pages", "Evicted device pages copied to the host.", tiers.offloadedPages},
                Counter{"onboarded_pages", "Host pages copied back to the device by admissions.", tiers.onboardedPages},
                Counter{"spilled_pages", "Host pages written to the disk tier.", tiers.spilledPages},
                Counter{"restored_pages", "Disk pages read back into host pages by admissions.", tiers.restoredPages},
                Counter{"disk_failures", "Disk pages that could not be written or read back.", tiers.diskFailures}})
        {
            name = prefix + "_" + counter.name + "_total";
            family(out, name, counter.help);
            out += fmt::format("{} {}\n", name, counter.value);
        }
    }
    if (!counters.tenants.empty())
    {
        name = prefix + "_tenant_prefix_query_tokens_total";
        family(out, name, "Prompt tokens looked up in the prefix cache, by tenant (salt, hex).");
        for (PrefixTenantStats const& tenant : counters.tenants)
        {
            out += fmt::format("{}{{tenant=\"{}\"}} {}\n", name, tenantLabel(tenant), tenant.queryTokens);
        }
        name = prefix + "_tenant_prefix_hit_tokens_total";
        family(out, name, "Prompt tokens found in the prefix cache, by tenant (salt, hex) and tier.");
        for (PrefixTenantStats const& tenant : counters.tenants)
        {
            std::string const label = tenantLabel(tenant);
            out += fmt::format("{}{{tenant=\"{}\",tier=\"device\"}} {}\n", name, label, tenant.deviceHitTokens);
            if (counters.hasTiers)
            {
                out += fmt::format("{}{{tenant=\"{}\",tier=\"host\"}} {}\n", name, label, tenant.hostHitTokens);
                out += fmt::format("{}{{tenant=\"{}\",tier=\"disk\"}} {}\n", name, label, tenant.diskHitTokens);
            }
        }
    }
    return out;
}

} // namespace kvcache::rt
