// kvcache continuous batching: a serving loop's page bookkeeping, simulated on the host with rt::PageManager. Requests
// arrive over time, each a shared system prompt plus its own user tokens; a request asking for several samples forks
// its sequence once the prompt is prefilled (parallel sampling), every sequence decodes one token a step until its
// own random length and is freed. Prompts adopt the cached prefix first, so the system prompt is computed once. The
// program prints what sharing saved and checks the manager's invariants after every step. Needs no GPU. Built with
// kvcache::events, --kv-events publishes the run's KV events in vLLM's wire format for a cache-aware router.
//
// Run: kvcache-continuous-batching [--requests N] [--samples N] [--tokens-per-page N] [--system-prompt N] [--seed N]
//      [--kv-events ENDPOINT [--kv-events-wait-ms N]]

#include "kvcache/core/errors.h"
#include "kvcache/core/kv_cache_config.h"
#include "kvcache/core/kv_cache_layout.h"
#include "kvcache/paging/page_manager.h"
#if KVCACHE_EXAMPLE_KV_EVENTS
#include "kvcache/events/kv_event_publisher.h"
#endif

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <exception>
#include <limits>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

namespace
{

namespace rt = kvcache::rt;

//! Token ids are drawn from [0, kVOCABULARY).
constexpr int32_t kVOCABULARY = 32000;

//! A command-line mistake: printed with the usage hint, exit status 2.
class UsageError : public std::runtime_error
{
public:
    using std::runtime_error::runtime_error;
};

//! The simulation's knobs.
struct Options
{
    int32_t requests = 256;
    int32_t samples = 4;
    int32_t tokensPerPage = 16;
    int32_t systemPrompt = 512;
    int32_t userTokens = 128;
    int32_t newTokens = 256;
    int32_t batch = 32;
    int32_t chunk = 256;
    uint32_t seed = 1;
    //! Where to publish KV events; empty for nowhere.
    std::string kvEvents;
    int32_t kvEventsWaitMs = 1000;
    bool help = false;
};

std::string usageText()
{
    return R"(usage: kvcache-continuous-batching [options]

Simulates the page bookkeeping of continuous batching with rt::PageManager (host only, no GPU): requests of a shared
system prompt plus their own tokens arrive over time, adopt the cached prefix, prefill in chunks, fork into samples
(parallel sampling), decode one token a step to a random length and leave. Prints pages at peak against a cache that
shares nothing, what forks and prefix hits saved, evictions and copy-on-write copies.

  --requests N         requests to serve (default 256)
  --samples N          most samples a request asks for; each asks for 1 to N (default 4)
  --tokens-per-page N  tokens a page holds, a power of two in [1, 1024] (default 16)
  --system-prompt N    tokens of the system prompt every request starts with (default 512)
  --user-tokens N      most user tokens after it; each request has 1 to N (default 128)
  --new-tokens N       most tokens a sample decodes; each decodes 1 to N (default 256)
  --batch N            most sequences alive at once, samples included (default 32)
  --chunk N            most prompt tokens a sequence prefills in one step (default 256)
  --seed N             seed of every random draw (default 1)
  --kv-events ENDPOINT publish the run's KV events in vLLM's wire format on this ZeroMQ endpoint (e.g. tcp://*:5557;
                       tcp://127.0.0.1:* binds a free port), one batch a step; the endpoint is printed first
  --kv-events-wait-ms N  with --kv-events: wait up to N ms for a subscriber before the first step (default 1000)
  -h, --help           print this help
)";
}

//! Parses `text` as a whole number in [minimum, maximum] for `flag`.
int32_t parseCount(std::string_view flag, std::string_view text, int32_t minimum, int32_t maximum)
{
    int64_t value = 0;
    auto const [end, status] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (text.empty() || status != std::errc{} || end != text.data() + text.size() || value < minimum || value > maximum)
    {
        throw UsageError(
            fmt::format("{} expects a whole number in [{}, {}], got \"{}\"", flag, minimum, maximum, text));
    }
    return static_cast<int32_t>(value);
}

Options parseOptions(std::vector<std::string> const& args)
{
    Options options;
    int32_t const kMAX_TOKENS = 1 << 20;
    for (size_t i = 0; i < args.size(); ++i)
    {
        std::string_view const flag = args[i];
        if (flag == "--help" || flag == "-h")
        {
            options.help = true;
            continue;
        }
        if (i + 1 >= args.size())
        {
            throw UsageError(fmt::format("{} needs a value (see --help)", flag));
        }
        std::string_view const value = args[++i];
        if (flag == "--requests")
        {
            options.requests = parseCount(flag, value, 1, 1000000);
        }
        else if (flag == "--samples")
        {
            options.samples = parseCount(flag, value, 1, 1024);
        }
        else if (flag == "--tokens-per-page")
        {
            options.tokensPerPage = parseCount(flag, value, 1, rt::kMAX_TOKENS_PER_PAGE);
        }
        else if (flag == "--system-prompt")
        {
            options.systemPrompt = parseCount(flag, value, 0, kMAX_TOKENS);
        }
        else if (flag == "--user-tokens")
        {
            options.userTokens = parseCount(flag, value, 1, kMAX_TOKENS);
        }
        else if (flag == "--new-tokens")
        {
            options.newTokens = parseCount(flag, value, 1, kMAX_TOKENS);
        }
        else if (flag == "--batch")
        {
            options.batch = parseCount(flag, value, 1, 65536);
        }
        else if (flag == "--chunk")
        {
            options.chunk = parseCount(flag, value, 1, kMAX_TOKENS);
        }
        else if (flag == "--seed")
        {
            options.seed = static_cast<uint32_t>(parseCount(flag, value, 0, std::numeric_limits<int32_t>::max()));
        }
        else if (flag == "--kv-events")
        {
#if KVCACHE_EXAMPLE_KV_EVENTS
            if (value.empty())
            {
                throw UsageError("--kv-events expects a ZeroMQ endpoint, got \"\"");
            }
            options.kvEvents = value;
#else
            throw UsageError("--kv-events needs kvcache::events, which this build lacks (KVCACHE_BUILD_EVENTS: "
                             "Debian's cppzmq-dev and libmsgpack-cxx-dev)");
#endif
        }
        else if (flag == "--kv-events-wait-ms")
        {
            options.kvEventsWaitMs = parseCount(flag, value, 0, 3600 * 1000);
        }
        else
        {
            throw UsageError(fmt::format("unknown flag \"{}\" (see --help)", flag));
        }
    }
    if (options.samples > options.batch)
    {
        throw UsageError(
            fmt::format("--samples {} exceeds --batch {}: a request's samples must fit in the batch at once",
                options.samples, options.batch));
    }
    return options;
}

//! Returns `value` with thousands separators: 1234567 -> "1,234,567".
std::string formatCount(int64_t value)
{
    std::string const digits = fmt::format("{}", value < 0 ? -value : value);
    std::string text = value < 0 ? "-" : "";
    for (size_t i = 0; i < digits.size(); ++i)
    {
        if (i != 0 && (digits.size() - i) % 3 == 0)
        {
            text += ',';
        }
        text += digits[i];
    }
    return text;
}

//! Returns part / whole as a percentage with one decimal, e.g. "35.9%".
std::string formatPercent(int64_t part, int64_t whole)
{
    return whole == 0 ? std::string("0.0%")
                      : fmt::format("{:.1f}%", 100.0 * static_cast<double>(part) / static_cast<double>(whole));
}

//! A live sequence: its prompt tokens still to prefill, its length, where it stops.
struct Sequence
{
    rt::SequenceId id = -1;
    int32_t request = 0;
    std::vector<int32_t> pending;
    int32_t length = 0;
    int32_t targetLength = 0;
    //! Samples still to fork off once the prompt is prefilled.
    int32_t forksLeft = 0;
};

//! A request waiting to be admitted.
struct Request
{
    int32_t index = 0;
    std::vector<int32_t> prompt;
    int32_t samples = 1;
};

//! What the run measured.
struct Totals
{
    int64_t steps = 0;
    int64_t sequences = 0;
    int64_t forks = 0;
    int64_t forkSharedPages = 0;
    int64_t prefillTokens = 0;
    int64_t decodeTokens = 0;
    int64_t copies = 0;
    int32_t peakUsed = 0;
    int64_t peakUnshared = 0;
    int32_t usedAtPeakUnshared = 0;
    int32_t peakShared = 0;
    int32_t finished = 0;
};

int32_t pagesFor(int32_t tokens, int32_t tokensPerPage)
{
    return (tokens + tokensPerPage - 1) / tokensPerPage;
}

//! Runs the simulation; returns the process exit status.
int simulate(Options const& options)
{
    std::mt19937 random(options.seed);
    auto draw = [&random](int32_t low, int32_t high)
    { return std::uniform_int_distribution<int32_t>(low, high)(random); };

    // One layer is enough: the manager sizes its pages from the layout and never touches device memory. The pool is
    // the minimum, batch x pagesPerSequence, so a batch of full-length sequences always fits and nothing waits.
    rt::KVCacheConfig config;
    config.numAttentionLayers = 1;
    config.layerConfigs = {{8, 128}};
    config.maxBatchSize = options.batch;
    config.maxSequenceLength = options.systemPrompt + options.userTokens + options.newTokens;
    config.tokensPerPage = options.tokensPerPage;
    config.maxTokensPerStep = std::min(options.chunk, config.maxSequenceLength);
    rt::PageManagerOptions managerOptions;
    managerOptions.recordEvents = !options.kvEvents.empty();
    rt::PageManager manager(config, managerOptions);
    rt::KVEventBatch events;
#if KVCACHE_EXAMPLE_KV_EVENTS
    std::unique_ptr<rt::KVEventPublisher> publisher;
    if (!options.kvEvents.empty())
    {
        rt::KVEventPublisherOptions publisherOptions;
        publisherOptions.endpoint = options.kvEvents;
        publisherOptions.lingerMs = 2000; // the process ends right after the run: let the last batches go out
        publisher = std::make_unique<rt::KVEventPublisher>(publisherOptions);
        // Printed before waiting, so that a subscriber started with the program learns a port bound as "*".
        std::printf("kv events: publishing on %s\n", publisher->endpoint().c_str());
        std::fflush(stdout);
        publisher->waitForSubscriber(options.kvEventsWaitMs);
    }
#endif
    // Hands the events recorded since the last call to the publisher, one batch; nothing without --kv-events.
    auto publishEvents = [&]()
    {
        manager.takeEvents(events);
#if KVCACHE_EXAMPLE_KV_EVENTS
        if (publisher)
        {
            // Swapped, not copied: the batch comes back cleared, with the buffers of one sent before.
            publisher->publishSwap(events);
        }
#endif
    };
    publishEvents(); // the manager's first batch: all blocks cleared
    int32_t const tokensPerPage = options.tokensPerPage;
    int32_t const numPages = manager.layout().groups[0].numPages;

    std::vector<int32_t> systemPrompt(static_cast<size_t>(options.systemPrompt));
    for (int32_t& token : systemPrompt)
    {
        token = draw(0, kVOCABULARY - 1);
    }

    Totals totals;
    std::deque<Request> waiting;
    std::vector<Sequence> live;
    std::vector<int32_t> liveSamples(static_cast<size_t>(options.requests), 0);
    int32_t arrived = 0;
    std::vector<int32_t> chunk;
    std::vector<std::vector<int32_t>> chunks;
    std::vector<rt::SequenceAppend> appends;
    std::vector<size_t> rows;

    while (totals.finished < options.requests)
    {
        // Up to two requests arrive a step.
        for (int32_t n = draw(0, 2); n > 0 && arrived < options.requests; --n, ++arrived)
        {
            Request request;
            request.index = arrived;
            request.prompt = systemPrompt;
            for (int32_t i = draw(1, options.userTokens); i > 0; --i)
            {
                request.prompt.push_back(draw(0, kVOCABULARY - 1));
            }
            request.samples = draw(1, options.samples);
            waiting.push_back(std::move(request));
        }
        // Admission, first come first served, while the batch has room for a request and all its samples.
        int32_t reserved = 0;
        for (Sequence const& sequence : live)
        {
            reserved += 1 + sequence.forksLeft;
        }
        while (!waiting.empty() && reserved + waiting.front().samples <= manager.maxSequences())
        {
            Request const request = std::move(waiting.front());
            waiting.pop_front();
            Sequence sequence;
            sequence.id = manager.create();
            sequence.request = request.index;
            int32_t const count = static_cast<int32_t>(request.prompt.size());
            sequence.length = manager.adoptPrefix(sequence.id, request.prompt.data(), count);
            sequence.pending.assign(request.prompt.begin() + sequence.length, request.prompt.end());
            sequence.targetLength = count + draw(1, options.newTokens);
            sequence.forksLeft = request.samples - 1;
            reserved += request.samples;
            liveSamples[static_cast<size_t>(request.index)] = request.samples;
            ++totals.sequences;
            live.push_back(std::move(sequence));
        }

        // One step: each sequence appends its next prompt chunk or one sampled token.
        chunks.assign(live.size(), {});
        appends.clear();
        rows.clear();
        for (size_t row = 0; row < live.size(); ++row)
        {
            Sequence const& sequence = live[row];
            chunk.clear();
            if (!sequence.pending.empty())
            {
                size_t const count = std::min(sequence.pending.size(), static_cast<size_t>(config.maxTokensPerStep));
                chunk.assign(sequence.pending.begin(), sequence.pending.begin() + static_cast<std::ptrdiff_t>(count));
                totals.prefillTokens += static_cast<int64_t>(count);
            }
            else
            {
                chunk.push_back(draw(0, kVOCABULARY - 1));
                ++totals.decodeTokens;
            }
            chunks[row] = chunk;
            rt::SequenceAppend append;
            append.sequence = sequence.id;
            append.tokens = chunks[row].data();
            append.count = static_cast<int32_t>(chunks[row].size());
            appends.push_back(append);
            rows.push_back(row);
        }
        rt::StepCopies const copies = manager.step(appends.data(), static_cast<int32_t>(appends.size()));
        ++totals.steps;
        // A runtime would enqueue these with rt::copyPages before the step's kernels; here they are only counted.
        totals.copies += static_cast<int64_t>(copies[0].size());
        for (size_t i = 0; i < appends.size(); ++i)
        {
            Sequence& sequence = live[rows[i]];
            sequence.length += appends[i].count;
            if (!sequence.pending.empty())
            {
                sequence.pending.erase(sequence.pending.begin(), sequence.pending.begin() + appends[i].count);
            }
        }

        // Pages in use against a cache that shares nothing (every sequence its own pages), measured after the step.
        int64_t unshared = 0;
        for (Sequence const& sequence : live)
        {
            if (manager.length(sequence.id) != sequence.length)
            {
                throw std::logic_error(fmt::format("sequence {} has {} tokens in the manager, {} in the simulation",
                    sequence.id, manager.length(sequence.id), sequence.length));
            }
            unshared += pagesFor(sequence.length, tokensPerPage);
        }
        rt::PageGroupCounts const counts = manager.counts(0);
        if (counts.used > unshared)
        {
            throw std::logic_error(
                fmt::format("{} pages used, more than the {} of a cache that shares nothing", counts.used, unshared));
        }
        totals.peakUsed = std::max(totals.peakUsed, counts.used);
        totals.peakShared = std::max(totals.peakShared, counts.shared);
        if (unshared > totals.peakUnshared)
        {
            totals.peakUnshared = unshared;
            totals.usedAtPeakUnshared = counts.used;
        }
        manager.checkInvariants();

        // Prefilled prompts fork into their samples, which share every page until they write.
        size_t const parents = live.size();
        for (size_t i = 0; i < parents; ++i)
        {
            for (; live[i].pending.empty() && live[i].forksLeft > 0; --live[i].forksLeft)
            {
                // Built field by field: the parent's prompt is prefilled, so the child has nothing pending (and
                // copying the empty vector trips a false -Warray-bounds in GCC 13).
                Sequence child;
                child.request = live[i].request;
                child.length = live[i].length;
                child.id = manager.fork(live[i].id);
                child.targetLength = child.length + draw(1, options.newTokens);
                totals.forkSharedPages += pagesFor(child.length, tokensPerPage);
                ++totals.forks;
                ++totals.sequences;
                live.push_back(std::move(child));
            }
        }
        // Finished samples leave; a request is done when its last sample is.
        for (auto it = live.begin(); it != live.end();)
        {
            if (it->pending.empty() && it->forksLeft == 0 && it->length >= it->targetLength)
            {
                manager.free(it->id);
                if (--liveSamples[static_cast<size_t>(it->request)] == 0)
                {
                    ++totals.finished;
                }
                it = live.erase(it);
            }
            else
            {
                ++it;
            }
        }
        publishEvents();
    }
    manager.checkInvariants();

    rt::PageManagerStats const stats = manager.stats();
    rt::PageGroupCounts const counts = manager.counts(0);
    bool const consistent =
        stats.copyOnWritePages == totals.copies && counts.used == 0 && counts.free + counts.cached == numPages;

    std::string out;
    out += fmt::format("kvcache continuous batching: {} requests, system prompt {} tokens, 1-{} samples, {} tokens per "
                       "page (seed {})\n\n",
        formatCount(options.requests), formatCount(options.systemPrompt), options.samples, tokensPerPage, options.seed);
    out += fmt::format("  requests    {} served as {} sequences ({} forked for samples), batch up to {}\n",
        formatCount(totals.finished), formatCount(totals.sequences), formatCount(totals.forks), options.batch);
    out += fmt::format("  steps       {}: {} prompt tokens prefilled (chunks up to {}), {} decoded\n",
        formatCount(totals.steps), formatCount(totals.prefillTokens), formatCount(config.maxTokensPerStep),
        formatCount(totals.decodeTokens));
    out += fmt::format("  pool        {} pages of {} tokens ({} sequences of {} tokens)\n", formatCount(numPages),
        tokensPerPage, options.batch, formatCount(config.maxSequenceLength));
    out += fmt::format("  peak        {} pages used at most; {} without sharing at its peak, when {} were used "
                       "({} saved)\n",
        formatCount(totals.peakUsed), formatCount(totals.peakUnshared), formatCount(totals.usedAtPeakUnshared),
        formatPercent(totals.peakUnshared - totals.usedAtPeakUnshared, totals.peakUnshared));
    out += fmt::format("  forks       {} pages shared at fork time instead of copied; {} copy-on-write copies; up to "
                       "{} pages shared at once\n",
        formatCount(totals.forkSharedPages), formatCount(stats.copyOnWritePages), formatCount(totals.peakShared));
    out += fmt::format("  prefix      {} of {} prompt tokens found cached ({} hit rate): {} pages adopted, not "
                       "recomputed\n",
        formatCount(stats.prefixHitTokens), formatCount(stats.prefixQueryTokens),
        formatPercent(stats.prefixHitTokens, stats.prefixQueryTokens),
        formatCount(stats.prefixHitTokens / tokensPerPage));
    out += fmt::format("  evictions   {} cached pages evicted; {} still cached at the end\n",
        formatCount(stats.evictedPages), formatCount(counts.cached));
    out += fmt::format(
        "  invariants  checked after each of {} steps: {}\n", formatCount(totals.steps), consistent ? "OK" : "FAILED");
#if KVCACHE_EXAMPLE_KV_EVENTS
    if (publisher)
    {
        bool const flushed = publisher->flush(10000);
        rt::KVEventPublisherStats const published = publisher->stats();
        out += fmt::format("  kv events   {} batches ({} events) published on {}, {} dropped{}\n",
            formatCount(published.batches), formatCount(published.events), publisher->endpoint(),
            formatCount(published.droppedBatches), flushed ? "" : "; not all sent within 10 s");
    }
#endif
    // What a router that followed the events holds for this instance: the pages with a registered hash.
    for (int32_t group = 0; group < manager.numGroups(); ++group)
    {
        out += fmt::format("cached pages: {}\n", manager.counts(group).cached);
    }
    std::fputs(out.c_str(), stdout);
    if (!consistent)
    {
        std::fprintf(stderr,
            "kvcache-continuous-batching: inconsistent end state: %lld copy-on-write copies counted, %lld queued; %d "
            "pages used, %d free + %d cached of %d\n",
            static_cast<long long>(stats.copyOnWritePages), static_cast<long long>(totals.copies), counts.used,
            counts.free, counts.cached, numPages);
        return 1;
    }
    return 0;
}

} // namespace

int main(int argc, char** argv)
{
    try
    {
        Options const options = parseOptions(std::vector<std::string>(argv + 1, argv + argc));
        if (options.help)
        {
            std::fputs(usageText().c_str(), stdout);
            return 0;
        }
        return simulate(options);
    }
    catch (UsageError const& error)
    {
        std::fprintf(stderr, "kvcache-continuous-batching: %s\n", error.what());
        return 2;
    }
    catch (std::exception const& error)
    {
        std::fprintf(stderr, "kvcache-continuous-batching: %s\n", error.what());
        return 1;
    }
}
