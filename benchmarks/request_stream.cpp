// The request stream (request_stream.h). Every draw comes from the stream's SplitMix64 in a fixed order (the kind, then
// what the kind needs, then the output's length), so a shape and a seed give one stream.

#include "request_stream.h"

#include <algorithm>

namespace kvcache::bench
{

RequestStream::RequestStream(RequestShape const& shape, uint64_t seed)
    : mShape(shape)
    , mRandom(seed)
{
    SplitMix64 familyRandom(shape.families.seed);
    for (int32_t f = 0; f < shape.families.count; ++f)
    {
        std::vector<int32_t>& family = mFamilies.emplace_back();
        family.resize(static_cast<size_t>(familyRandom.between(shape.families.tokens.min, shape.families.tokens.max)));
        for (int32_t& token : family)
        {
            token = familyRandom.between(0, kREQUEST_VOCAB - 1);
        }
    }
}

Request RequestStream::next()
{
    Request request;
    int32_t const draw = mRandom.below(mShape.kindDraws) - mShape.firstRepeatDraw;
    bool const repeat = draw >= 0 && draw < mShape.repeatDraws;
    bool const followUp = draw >= mShape.repeatDraws && draw < mShape.repeatDraws + mShape.followUpDraws;
    if (repeat && !mPrompts.empty())
    {
        request.kind = 1;
        request.prompt = mPrompts[static_cast<size_t>(mRandom.below(static_cast<int32_t>(mPrompts.size())))];
    }
    else if (followUp && !mConversations.empty())
    {
        request.kind = 2;
        request.prompt =
            mConversations[static_cast<size_t>(mRandom.below(static_cast<int32_t>(mConversations.size())))];
        appendRandom(request.prompt, drawLength(mShape.followUp.userTokens));
        if (static_cast<int32_t>(request.prompt.size()) > mShape.followUp.maxTokens)
        {
            request.prompt.clear();
        }
    }
    if (request.prompt.empty())
    {
        request.kind = 0;
        std::vector<int32_t> const& family = mFamilies[static_cast<size_t>(mRandom.below(mShape.families.count))];
        int32_t const drawn = drawLength(mShape.newPrompt.tokens);
        int32_t const familyTokens = static_cast<int32_t>(family.size());
        int32_t const shared = mShape.newPrompt.lengthIsPrompt
            ? std::min(familyTokens, drawn - mShape.newPrompt.minUserTokens)
            : familyTokens;
        int32_t const user = mShape.newPrompt.lengthIsPrompt ? drawn - shared : drawn;
        request.prompt.assign(family.begin(), family.begin() + shared);
        appendRandom(request.prompt, user);
    }
    appendRandom(request.output, drawLength(mShape.outputTokens));
    remember(mPrompts, mNextPrompt, request.prompt);
    return request;
}

void RequestStream::finished(Request const& request)
{
    std::vector<int32_t> conversation = request.prompt;
    conversation.insert(conversation.end(), request.output.begin(), request.output.end());
    remember(mConversations, mNextConversation, conversation);
}

int32_t RequestStream::drawLength(TokenRange range)
{
    return mRandom.between(range.min, range.max);
}

void RequestStream::appendRandom(std::vector<int32_t>& tokens, int32_t count)
{
    for (int32_t i = 0; i < count; ++i)
    {
        tokens.push_back(mRandom.between(0, kREQUEST_VOCAB - 1));
    }
}

void RequestStream::remember(
    std::vector<std::vector<int32_t>>& ring, size_t& next, std::vector<int32_t> const& tokens) const
{
    if (ring.size() < static_cast<size_t>(mShape.history))
    {
        ring.push_back(tokens);
        return;
    }
    ring[next] = tokens;
    next = (next + 1) % ring.size();
}

} // namespace kvcache::bench
