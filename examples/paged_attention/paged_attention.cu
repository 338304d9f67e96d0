// kvcache paged attention: a single-query (decode) attention kernel that reads K and V through a layer's LayerRef and
// the device block table that rt::PageTableBuffers builds from a PageManager's pages, checked against the same
// attention computed from the slot view of an identity-mapped copy of the cache, and against a float64 CPU reference.
// The batch is made as a runtime makes it: earlier requests come and go, prompts prefill in chunks, one sample forks
// and shares its parent's pages. Each layer's step is a runtime's: rt::writeTokens puts the new K and V into the
// layer's pages through the PageTableBuffers (their CSR form), then the attention kernel reads them. It shows that
// LayerRef and the pool view are exactly the [numPages, tokensPerPage, H, D] K and V pools that paged attention kernels
// take, and that a PageManager's page table addresses them.
//
// Run: kvcache-paged-attention   (exits 77 without a GPU, or 1 when KVCACHE_REQUIRE_GPU=1 is set)

#include <kvcache/kvcache.h>
#include <kvcache/paging/page_manager.h>
#include <kvcache/paging/page_table.h>

#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <limits>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace
{

namespace rt = kvcache::rt;

//! Exit status that ctest reports as "skipped".
constexpr int kEXIT_SKIPPED = 77;
//! Threads per attention block: one block per (sequence, query head).
constexpr int32_t kTHREADS = 128;
//! Query heads per KV head (grouped-query attention).
constexpr int32_t kGROUP_SIZE = 4;
//! Largest |paged - dense|: both kernels do the same arithmetic in the same order, only the addressing differs.
constexpr double kPAGED_VS_DENSE_TOLERANCE = 1e-6;
//! Largest error against the float64 reference, relative to the largest |output| of the same (sequence, head).
constexpr double kRELATIVE_TOLERANCE = 1e-3;
//! float16 NaN: fills every cache position no sequence owns, so a kernel that reads one produces NaN and fails.
constexpr uint16_t kPOISON_BITS = 0x7E00;
//! Two of them, the 4-byte pattern rt::resetPages fills pages with.
constexpr uint32_t kPOISON_PATTERN = (uint32_t{kPOISON_BITS} << 16) | kPOISON_BITS;
//! Prompt tokens a sequence appends per step (chunked prefill).
constexpr int32_t kPREFILL_CHUNK = 16;
//! Earlier requests that filled the pool before the batch and finished, and their lengths: 5 x 12 pages of 16 tokens
//! hold 60 of the 64 pages.
constexpr int32_t kWARM_UP_SEQUENCES = 5;
constexpr int32_t kWARM_UP_TOKENS = 192;
//! The batch row forked from row 0, and the tokens they share: 8 whole pages, so no page is written by both.
constexpr int32_t kFORKED = 3;
constexpr int32_t kFORK_TOKENS = 128;
//! Token ids are drawn from [0, kVOCABULARY); with prefix caching off they only feed the manager's bookkeeping.
constexpr int32_t kVOCABULARY = 32000;

//! Returns why no GPU can be used, or an empty string when one can.
std::string gpuUnavailableReason()
{
    int count = 0;
    cudaError_t const status = cudaGetDeviceCount(&count);
    if (status != cudaSuccess)
    {
        cudaGetLastError();
        return std::string("cudaGetDeviceCount returned ") + cudaGetErrorName(status);
    }
    return count == 0 ? std::string("no CUDA device is visible") : std::string();
}

//! Returns true when KVCACHE_REQUIRE_GPU=1, which turns a missing GPU from a skip into a failure.
bool gpuRequired()
{
    char const* value = std::getenv("KVCACHE_REQUIRE_GPU");
    return value != nullptr && std::string_view(value) == "1";
}

//! One decode step of one layer: a query per (sequence, query head) and where the attention output goes.
struct DecodeArgs
{
    float const* q;         //!< [batch, numHeads, headDim]
    float* out;             //!< [batch, numHeads, headDim]
    int32_t const* seqLens; //!< [batch]
    int32_t numHeads;       //!< query heads: kGROUP_SIZE * numKVHeads
    int32_t headDim;        //!< D
    float scale;            //!< 1 / sqrt(headDim)
};

//! K and V of one layer read through its LayerRef and a page table [batch, maxPagesPerSeq].
struct PagedKV
{
    rt::LayerRef layer;
    int32_t const* pageTable; //!< page of token t of sequence b: pageTable[b * maxPagesPerSeq + t / tokensPerPage]
    int32_t maxPagesPerSeq;

    //! Returns the headDim K values of head `kvHead` of token `token` of sequence `seq`.
    __device__ __half const* k(int32_t seq, int32_t token, int32_t kvHead) const
    {
        return layer.k<__half const>(page(seq, token), token % layer.tokensPerPage, kvHead);
    }
    //! Returns the headDim V values of head `kvHead` of token `token` of sequence `seq`.
    __device__ __half const* v(int32_t seq, int32_t token, int32_t kvHead) const
    {
        return layer.v<__half const>(page(seq, token), token % layer.tokensPerPage, kvHead);
    }
    //! Returns the page that holds token `token` of sequence `seq`.
    __device__ int32_t page(int32_t seq, int32_t token) const
    {
        return pageTable[seq * maxPagesPerSeq + token / layer.tokensPerPage];
    }
};

//! K and V read through the slot view [2, maxBatchSize, capPadded, H, D] of an identity-mapped cache.
struct DenseKV
{
    __half const* kBase; //!< slot view element (0, 0, 0, 0, 0)
    __half const* vBase; //!< slot view element (1, 0, 0, 0, 0)
    int64_t slotStride;  //!< slot view strides, in elements
    int64_t tokenStride;
    int64_t headStride;

    //! Returns the headDim K values of head `kvHead` of token `token` of sequence `seq`.
    __device__ __half const* k(int32_t seq, int32_t token, int32_t kvHead) const
    {
        return kBase + offset(seq, token, kvHead);
    }
    //! Returns the headDim V values of head `kvHead` of token `token` of sequence `seq`.
    __device__ __half const* v(int32_t seq, int32_t token, int32_t kvHead) const
    {
        return vBase + offset(seq, token, kvHead);
    }
    //! Returns where head `kvHead` of token `token` of sequence `seq` starts, in elements from kBase (and vBase).
    __device__ int64_t offset(int32_t seq, int32_t token, int32_t kvHead) const
    {
        return seq * slotStride + token * tokenStride + kvHead * headStride;
    }
};

//! Returns max(a, b) for blockReduce.
struct MaxOp
{
    __device__ float operator()(float a, float b) const
    {
        return fmaxf(a, b);
    }
};

//! Returns a + b for blockReduce.
struct SumOp
{
    __device__ float operator()(float a, float b) const
    {
        return a + b;
    }
};

//! Returns `op` folded over `value` of every thread of the block, to every thread; blockDim.x must be kTHREADS.
template <typename Op>
__device__ float blockReduce(float value, Op op)
{
    __shared__ float warpResults[kTHREADS / 32];
    for (int32_t lanes = 16; lanes > 0; lanes /= 2)
    {
        value = op(value, __shfl_xor_sync(0xFFFFFFFFu, value, lanes));
    }
    if (threadIdx.x % 32 == 0)
    {
        warpResults[threadIdx.x / 32] = value;
    }
    __syncthreads();
    value = warpResults[0];
    for (int32_t warp = 1; warp < kTHREADS / 32; ++warp)
    {
        value = op(value, warpResults[warp]);
    }
    __syncthreads(); // warpResults is reused by the next call
    return value;
}

//! out = softmax(q . K^T * scale) . V for query head blockIdx.x of sequence blockIdx.y, in fp32. `Cache` says where
//! a token's K and V rows are (k() and v()); everything else is shared by the paged and the dense kernel.
template <typename Cache>
__device__ void decodeAttention(Cache const& cache, DecodeArgs const& args)
{
    extern __shared__ float weights[]; // one per token of the sequence
    int32_t const seq = static_cast<int32_t>(blockIdx.y);
    int32_t const head = static_cast<int32_t>(blockIdx.x);
    int32_t const kvHead = head / kGROUP_SIZE;
    int32_t const length = args.seqLens[seq];
    int32_t const stride = static_cast<int32_t>(blockDim.x);
    int64_t const row = (int64_t{seq} * args.numHeads + head) * args.headDim;
    float const* q = args.q + row;

    // 1. Scores: q . k_t * scale, one token per thread at a time.
    float localMax = -INFINITY;
    for (int32_t t = static_cast<int32_t>(threadIdx.x); t < length; t += stride)
    {
        __half const* k = cache.k(seq, t, kvHead);
        float dot = 0.0F;
        for (int32_t d = 0; d < args.headDim; ++d)
        {
            dot += q[d] * __half2float(k[d]);
        }
        weights[t] = dot * args.scale;
        localMax = fmaxf(localMax, weights[t]);
    }
    float const maxScore = blockReduce(localMax, MaxOp{});

    // 2. Unnormalised softmax weights exp(score - max) and their sum.
    float localSum = 0.0F;
    for (int32_t t = static_cast<int32_t>(threadIdx.x); t < length; t += stride)
    {
        weights[t] = expf(weights[t] - maxScore);
        localSum += weights[t];
    }
    float const sum = blockReduce(localSum, SumOp{}); // also makes every weight visible to every thread

    // 3. Output: the weighted sum of the V rows, one dimension per thread at a time.
    for (int32_t d = static_cast<int32_t>(threadIdx.x); d < args.headDim; d += stride)
    {
        float acc = 0.0F;
        for (int32_t t = 0; t < length; ++t)
        {
            acc += weights[t] * __half2float(cache.v(seq, t, kvHead)[d]);
        }
        args.out[row + d] = acc / sum;
    }
}

//! Decode attention reading K and V through a layer's LayerRef (passed by value) and the page table: what a paged
//! runtime binds.
__global__ void pagedDecodeAttentionKernel(
    rt::LayerRef layer, int32_t const* pageTable, int32_t maxPagesPerSeq, DecodeArgs args)
{
    decodeAttention(PagedKV{layer, pageTable, maxPagesPerSeq}, args);
}

//! The same attention reading K and V through the slot view of an identity-mapped cache.
__global__ void denseDecodeAttentionKernel(DenseKV cache, DecodeArgs args)
{
    decodeAttention(cache, args);
}

//! Owns a CUDA stream; it must outlive the KVCacheManagers that free their memory on it.
class Stream
{
public:
    Stream()
    {
        KVCACHE_CUDA_TRY(cudaStreamCreateWithFlags(&mStream, cudaStreamNonBlocking));
    }
    ~Stream()
    {
        KVCACHE_CUDA_LOG(cudaStreamDestroy(mStream));
    }
    Stream(Stream const&) = delete;
    Stream& operator=(Stream const&) = delete;

    //! Returns the stream.
    cudaStream_t get() const noexcept
    {
        return mStream;
    }

private:
    cudaStream_t mStream{nullptr};
};

//! Owns a device array of `T`.
template <typename T>
class DeviceArray
{
public:
    explicit DeviceArray(size_t count)
        : mCount(count)
    {
        KVCACHE_CUDA_TRY(cudaMalloc(&mData, count * sizeof(T)));
    }
    ~DeviceArray()
    {
        KVCACHE_CUDA_LOG(cudaFree(mData));
    }
    DeviceArray(DeviceArray const&) = delete;
    DeviceArray& operator=(DeviceArray const&) = delete;

    //! Returns the device pointer.
    T* get() const noexcept
    {
        return mData;
    }
    //! Copies `host` (of the array's size) to the device, stream-ordered.
    void upload(std::vector<T> const& host, cudaStream_t stream)
    {
        KVCACHE_CUDA_TRY(cudaMemcpyAsync(mData, host.data(), mCount * sizeof(T), cudaMemcpyHostToDevice, stream));
    }

private:
    T* mData{nullptr};
    size_t mCount;
};

//! Returns the float16 NaN every unowned cache position holds.
__half poison()
{
    __half_raw raw{};
    raw.x = kPOISON_BITS;
    return __half(raw);
}

//! Returns the larger error; NaN, once seen, stays.
double worse(double a, double b)
{
    return std::isnan(a) || std::isnan(b) ? std::numeric_limits<double>::quiet_NaN() : std::max(a, b);
}

//! Returns the largest |got - expected| over each (sequence, head) row of `headDim` values, divided by the largest
//! |expected| of that row (so outputs near zero do not blow the error up).
double maxRelativeError(std::vector<float> const& got, std::vector<double> const& expected, int32_t headDim)
{
    double result = 0.0;
    for (size_t row = 0; row < expected.size(); row += static_cast<size_t>(headDim))
    {
        double rowScale = 0.0;
        for (size_t i = row; i < row + static_cast<size_t>(headDim); ++i)
        {
            rowScale = std::max(rowScale, std::abs(expected[i]));
        }
        for (size_t i = row; i < row + static_cast<size_t>(headDim); ++i)
        {
            result = worse(result, std::abs(static_cast<double>(got[i]) - expected[i]) / rowScale);
        }
    }
    return result;
}

//! Runs the example; returns the process exit status.
int runPagedAttention()
{
    // Two layers of different shapes, with 12 retained pages beyond the minimum. A small page size keeps the
    // page table interesting.
    rt::KVCacheManager::Config config;
    config.numAttentionLayers = 2;
    config.maxBatchSize = 4;
    config.maxSequenceLength = 200;
    config.layerConfigs = {{2, 64}, {4, 128}};
    config.kvCacheType = rt::DataType::kHALF;
    config.tokensPerPage = 16;
    config.maxTokensPerStep = kPREFILL_CHUNK;
    int32_t const retainedPages = 12;
    config.numPages = rt::KVCacheManager::validate(config).minPages + retainedPages;

    // The identity-mapped copy: the minimum number of pages, so the slot view is valid.
    rt::KVCacheManager::Config denseConfig = config;
    denseConfig.numPages = 0;

    Stream stream;
    rt::KVCacheManager paged(config, stream.get());
    rt::KVCacheManager dense(denseConfig, stream.get());
    rt::KVCacheLayout const& layout = paged.layout();
    int32_t const batch = config.maxBatchSize;
    int32_t const tokensPerPage = layout.tokensPerPage;
    int64_t const capPadded = layout.capPadded;

    // The page lifecycle runs in a PageManager of the same config. Prefix caching is off, so a freed page goes back
    // to the free list (most recently freed first) and the ids below depend only on the order of the calls.
    rt::PageManagerOptions managerOptions;
    managerOptions.enablePrefixCaching = false;
    managerOptions.maxSequences = kWARM_UP_SEQUENCES;
    rt::PageManager manager(config, managerOptions);
    std::mt19937 rng(2024);
    std::uniform_int_distribution<int32_t> tokenId(0, kVOCABULARY - 1);
    auto prefill = [&](std::vector<rt::SequenceId> const& sequences, std::vector<int32_t> const& lengths)
    {
        // Chunked prefill in lockstep, as a runtime batches prompts: each step appends up to kPREFILL_CHUNK tokens to
        // every sequence not yet at its length, so the sequences' pages interleave.
        std::vector<int32_t> tokens(kPREFILL_CHUNK);
        for (bool appended = true; appended;)
        {
            std::vector<rt::SequenceAppend> appends;
            for (size_t i = 0; i < sequences.size(); ++i)
            {
                int32_t const count = std::min(kPREFILL_CHUNK, lengths[i] - manager.length(sequences[i]));
                if (count > 0)
                {
                    rt::SequenceAppend append;
                    append.sequence = sequences[i];
                    append.tokens = tokens.data();
                    append.count = count;
                    appends.push_back(append);
                }
            }
            for (int32_t& token : tokens)
            {
                token = tokenId(rng);
            }
            rt::StepCopies const copies = manager.step(appends.data(), static_cast<int32_t>(appends.size()));
            // Every write lands on a page no other sequence holds (forks below happen at page boundaries), so no
            // copy-on-write copy is queued; a runtime would run them with rt::copyPages before its kernels.
            if (!copies.empty())
            {
                throw std::logic_error("a step queued copies although no sequence writes to a shared page");
            }
            appended = !appends.empty();
        }
    };

    // Earlier requests filled most of the pool, the retained pages included, and finished: their pages are free again
    // in an order that scatters the ids the sequences below get.
    std::vector<rt::SequenceId> earlier;
    for (int32_t i = 0; i < kWARM_UP_SEQUENCES; ++i)
    {
        earlier.push_back(manager.create());
    }
    prefill(earlier, std::vector<int32_t>(earlier.size(), kWARM_UP_TOKENS));
    for (rt::SequenceId const sequence : earlier)
    {
        manager.free(sequence);
    }

    // The batch: sequences 0-2 prefill their prompts; sequence 3 is a sample forked from sequence 0 after its first
    // kFORK_TOKENS tokens (a page boundary), sharing those pages, and then goes its own way.
    std::vector<int32_t> const seqLens = {200, 1, 77, 178};
    std::vector<rt::SequenceId> sequences = {manager.create(), manager.create(), manager.create()};
    prefill({sequences[0]}, {kFORK_TOKENS});
    sequences.push_back(manager.fork(sequences[0]));
    prefill(sequences, seqLens);

    // The page table kernels read, built from the manager's pages: the block table [batch, maxPagesPerSequence].
    std::vector<rt::SequencePages> rows;
    for (rt::SequenceId const sequence : sequences)
    {
        rows.push_back(manager.pages(sequence, 0));
    }
    int32_t const maxPagesPerSeq = layout.pagesPerSlot;
    rt::PageTableBuffers tables(batch, maxPagesPerSeq, tokensPerPage, stream.get());
    tables.build(rows.data(), static_cast<int32_t>(rows.size()), stream.get());

    rt::PageGroupCounts const counts = manager.counts(0);
    int32_t retainedInUse = 0;
    std::printf("paged cache: %d pages of %d tokens (%d minimum + %d retained); page table from the PageManager:\n",
        paged.numPages(), tokensPerPage, paged.minPages(), paged.numPages() - paged.minPages());
    for (int32_t b = 0; b < batch; ++b)
    {
        std::printf("  sequence %d, %3d tokens%s:", b, seqLens[b], b == kFORKED ? " (forked from 0 at 128)" : "");
        for (int32_t i = 0; i < rows[b].numPages; ++i)
        {
            int32_t const page = rows[b].pages[i];
            bool const shared = b == kFORKED && i < kFORK_TOKENS / tokensPerPage;
            retainedInUse += page >= paged.minPages() && !shared ? 1 : 0;
            std::printf(" %d", page);
        }
        std::printf("\n");
    }
    std::printf("  %d pages in use, %d of them shared, %d retained (id >= %d)\n", counts.used, counts.shared,
        retainedInUse, paged.minPages());
    manager.checkInvariants();

    DeviceArray<int32_t> deviceSeqLens(seqLens.size());
    deviceSeqLens.upload(seqLens, stream.get());

    // Every cache position no sequence owns holds the poison (all layers, K and V, one launch), so a kernel that
    // reads one produces NaN and fails.
    std::vector<int32_t> allPages(static_cast<size_t>(paged.numPages()));
    std::iota(allPages.begin(), allPages.end(), 0);
    rt::resetPages(paged, allPages, stream.get(), kPOISON_PATTERN);

    // Where the write puts each row of a layer's new K and V (row b * capPadded + t): token t of sequence b, looked
    // up in the CSR page table the attention reads. Rows past a sequence's length are skipped (sequence -1), and so
    // are the fork's shared tokens: its parent writes them, and the fork reads them through the shared pages.
    std::vector<rt::TokenPosition> positions(static_cast<size_t>(batch * capPadded), rt::TokenPosition{-1, 0});
    for (int32_t b = 0; b < batch; ++b)
    {
        for (int32_t t = b == kFORKED ? kFORK_TOKENS : 0; t < seqLens[b]; ++t)
        {
            positions[static_cast<size_t>(b * capPadded + t)] = rt::TokenPosition{b, t};
        }
    }
    DeviceArray<rt::TokenPosition> devicePositions(positions.size());
    devicePositions.upload(positions, stream.get());
    rt::DevicePageTable const table{tables.deviceIndptr(), tables.deviceIndices(), tables.deviceFirstToken(), batch};

    bool pass = true;
    for (int32_t layer = 0; layer < paged.numLayers(); ++layer)
    {
        int64_t const numKVHeads = paged.getLayerConfig(layer).numKVHeads;
        int64_t const headDim = paged.getLayerConfig(layer).headDim;
        int32_t const numHeads = kGROUP_SIZE * static_cast<int32_t>(numKVHeads);
        int64_t const rowElems = numKVHeads * headDim; // one token's K (or V)

        // Each sequence's tokens in order: keys[((b * capPadded + t) * H + h) * D + d], random in [-1, 1) for
        // t < seqLens[b], poison after. K and V are drawn independently. The fork's first kFORK_TOKENS tokens are its
        // parent's.
        std::uniform_real_distribution<float> uniform(-1.0F, 1.0F);
        size_t const tokenElems = static_cast<size_t>(batch * capPadded * rowElems);
        std::vector<__half> keys(tokenElems, poison());
        std::vector<__half> values(tokenElems, poison());
        for (int32_t b = 0; b < batch; ++b)
        {
            for (int64_t i = 0; i < seqLens[b] * rowElems; ++i)
            {
                keys[b * capPadded * rowElems + i] = __float2half_rn(uniform(rng));
                values[b * capPadded * rowElems + i] = __float2half_rn(uniform(rng));
            }
        }
        std::copy_n(keys.begin(), kFORK_TOKENS * rowElems, keys.begin() + kFORKED * capPadded * rowElems);
        std::copy_n(values.begin(), kFORK_TOKENS * rowElems, values.begin() + kFORKED * capPadded * rowElems);
        // Queries larger than the keys make the softmax peaked, so the weights differ visibly from token to token.
        std::uniform_real_distribution<float> queryValue(-4.0F, 4.0F);
        std::vector<float> queries(static_cast<size_t>(batch * numHeads * headDim));
        for (float& q : queries)
        {
            q = queryValue(rng);
        }

        // The layer's K and V of the batch's tokens, in device memory as a model's projections leave them: rows
        // [batch * capPadded, H, D]. One write covers them all here; a runtime writes each step's chunk the same way.
        DeviceArray<__half> newKeys(keys.size());
        DeviceArray<__half> newValues(values.size());
        newKeys.upload(keys, stream.get());
        newValues.upload(values, stream.get());
        rt::Coords const rowsShape{int64_t{batch} * capPadded, numKVHeads, headDim};
        rt::Tensor const k(newKeys.get(), rowsShape, rt::DataType::kHALF, rt::DeviceType::kGPU);
        rt::Tensor const v(newValues.get(), rowsShape, rt::DataType::kHALF, rt::DeviceType::kGPU);

        // The paged cache: one launch writes every row to its (sequence, position) through the page table, with the
        // layer's geometry. Positions the table does not hold are counted, not written.
        DeviceArray<int32_t> writeErrors(1);
        KVCACHE_CUDA_TRY(cudaMemsetAsync(writeErrors.get(), 0, sizeof(int32_t), stream.get()));
        rt::TokenOpOptions writeOptions;
        writeOptions.deviceErrorCount = writeErrors.get();
        rt::writeTokens(paged, layer, k, v, table, devicePositions.get(), stream.get(), writeOptions);

        // The identity-mapped cache is the slot view [2, batch, capPadded, H, D]: the host rows, keys then values,
        // copied as they are, so the dense reference does not depend on the write under test.
        rt::Tensor const& slotView = dense.getCombinedKVCache(layer);
        rt::Coords const& slotStride = slotView.getStride();
        if (slotView.volume() != static_cast<int64_t>(2 * keys.size())
            || slotStride[0] != static_cast<int64_t>(keys.size()))
        {
            throw std::runtime_error("the slot view is not [2, batch, capPadded, H, D]");
        }
        __half* const slotBase = slotView.dataPointer<__half>();
        KVCACHE_CUDA_TRY(
            cudaMemcpyAsync(slotBase, keys.data(), keys.size() * sizeof(__half), cudaMemcpyHostToDevice, stream.get()));
        KVCACHE_CUDA_TRY(cudaMemcpyAsync(slotBase + slotStride[0], values.data(), values.size() * sizeof(__half),
            cudaMemcpyHostToDevice, stream.get()));

        // Engines that take a tensor bind the pool view: it must be the memory the LayerRef describes.
        rt::LayerRef const ref = paged.layerRef(layer);
        rt::Tensor const& poolView = paged.getCombinedKVCachePoolView(layer);
        rt::Coords const& poolStride = poolView.getStride();
        if (poolView.dataPointer<__half>() != ref.kPool || poolView.dataPointer<__half>() + poolStride[0] != ref.vPool
            || poolStride[1] != ref.pageStride || poolStride[2] != ref.tokenStride || poolStride[3] != ref.headStride)
        {
            std::fprintf(stderr, "layer %d: the pool view and the LayerRef disagree\n", layer);
            pass = false;
        }
        // Both kernels read a head's D values as one contiguous row.
        if (poolStride[4] != 1 || slotStride[4] != 1)
        {
            throw std::runtime_error("the kernels expect headDim to be the contiguous dimension");
        }
        DenseKV const denseKV{slotBase, slotBase + slotStride[0], slotStride[1], slotStride[2], slotStride[3]};

        DeviceArray<float> deviceQueries(queries.size());
        deviceQueries.upload(queries, stream.get());
        DeviceArray<float> pagedOut(queries.size());
        DeviceArray<float> denseOut(queries.size());

        DecodeArgs args{deviceQueries.get(), pagedOut.get(), deviceSeqLens.get(), numHeads,
            static_cast<int32_t>(headDim), 1.0F / std::sqrt(static_cast<float>(headDim))};
        dim3 const grid(static_cast<unsigned>(numHeads), static_cast<unsigned>(batch));
        size_t const sharedBytes = static_cast<size_t>(capPadded) * sizeof(float);
        pagedDecodeAttentionKernel<<<grid, kTHREADS, sharedBytes, stream.get()>>>(
            ref, tables.deviceBlockTable(), tables.maxPagesPerSequence(), args);
        KVCACHE_CUDA_TRY(cudaGetLastError());
        args.out = denseOut.get();
        denseDecodeAttentionKernel<<<grid, kTHREADS, sharedBytes, stream.get()>>>(denseKV, args);
        KVCACHE_CUDA_TRY(cudaGetLastError());

        std::vector<float> pagedResult(queries.size());
        std::vector<float> denseResult(queries.size());
        KVCACHE_CUDA_TRY(cudaMemcpyAsync(pagedResult.data(), pagedOut.get(), pagedResult.size() * sizeof(float),
            cudaMemcpyDeviceToHost, stream.get()));
        KVCACHE_CUDA_TRY(cudaMemcpyAsync(denseResult.data(), denseOut.get(), denseResult.size() * sizeof(float),
            cudaMemcpyDeviceToHost, stream.get()));
        int32_t unwritten = 0;
        KVCACHE_CUDA_TRY(
            cudaMemcpyAsync(&unwritten, writeErrors.get(), sizeof(int32_t), cudaMemcpyDeviceToHost, stream.get()));
        KVCACHE_CUDA_TRY(cudaStreamSynchronize(stream.get()));
        if (unwritten != 0)
        {
            std::fprintf(
                stderr, "layer %d: %d tokens lie outside the page table and were not written\n", layer, unwritten);
            pass = false;
        }

        // The float64 reference, straight from the tokens in order.
        std::vector<double> reference(queries.size());
        for (int32_t b = 0; b < batch; ++b)
        {
            for (int32_t head = 0; head < numHeads; ++head)
            {
                int64_t const kvHead = head / kGROUP_SIZE;
                int64_t const row = (int64_t{b} * numHeads + head) * headDim;
                std::vector<double> weights(static_cast<size_t>(seqLens[b]));
                for (int32_t t = 0; t < seqLens[b]; ++t)
                {
                    int64_t const token = ((b * capPadded + t) * numKVHeads + kvHead) * headDim;
                    double dot = 0.0;
                    for (int64_t d = 0; d < headDim; ++d)
                    {
                        dot +=
                            static_cast<double>(queries[row + d]) * static_cast<double>(__half2float(keys[token + d]));
                    }
                    weights[t] = dot / std::sqrt(static_cast<double>(headDim));
                }
                double const maxScore = *std::max_element(weights.begin(), weights.end());
                double sum = 0.0;
                for (double& weight : weights)
                {
                    weight = std::exp(weight - maxScore);
                    sum += weight;
                }
                for (int64_t d = 0; d < headDim; ++d)
                {
                    double acc = 0.0;
                    for (int32_t t = 0; t < seqLens[b]; ++t)
                    {
                        int64_t const token = ((b * capPadded + t) * numKVHeads + kvHead) * headDim;
                        acc += weights[t] * static_cast<double>(__half2float(values[token + d]));
                    }
                    reference[row + d] = acc / sum;
                }
            }
        }

        double pagedVsDense = 0.0;
        for (size_t i = 0; i < pagedResult.size(); ++i)
        {
            pagedVsDense = worse(pagedVsDense, std::abs(static_cast<double>(pagedResult[i]) - denseResult[i]));
        }
        double const pagedVsReference = maxRelativeError(pagedResult, reference, static_cast<int32_t>(headDim));
        double const denseVsReference = maxRelativeError(denseResult, reference, static_cast<int32_t>(headDim));
        bool const layerPass = pagedVsDense <= kPAGED_VS_DENSE_TOLERANCE && pagedVsReference < kRELATIVE_TOLERANCE
            && denseVsReference < kRELATIVE_TOLERANCE;
        pass = pass && layerPass;
        std::printf("layer %d (%d query heads on %lld KV heads, D %lld): max |paged - dense| %.3g; max relative error "
                    "vs float64: paged %.3g, dense %.3g: %s\n",
            layer, numHeads, static_cast<long long>(numKVHeads), static_cast<long long>(headDim), pagedVsDense,
            pagedVsReference, denseVsReference, layerPass ? "PASS" : "FAIL");
    }
    std::printf("%s\n", pass ? "PASS" : "FAIL");
    return pass ? 0 : 1;
}

} // namespace

int main()
{
    std::string const reason = gpuUnavailableReason();
    if (!reason.empty())
    {
        bool const required = gpuRequired();
        std::fprintf(stderr, "kvcache-paged-attention needs a CUDA GPU: %s; %s\n", reason.c_str(),
            required ? "failing because KVCACHE_REQUIRE_GPU=1" : "skipping (exit 77)");
        return required ? 1 : kEXIT_SKIPPED;
    }
    try
    {
        return runPagedAttention();
    }
    catch (std::exception const& error)
    {
        std::fprintf(stderr, "kvcache-paged-attention failed: %s\n", error.what());
        return 1;
    }
}
