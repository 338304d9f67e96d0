#include "plan.h"
#include "plan_internal.h"

#include <fmt/format.h>

#include <utility>

namespace kvcache::plan
{
namespace detail
{

//! Returns ascending indices as text: "0-31", "3, 7, ..., 47" for an evenly spaced run, else runs like "0-3, 8".
std::string formatRuns(std::vector<int32_t> const& indices)
{
    if (indices.size() >= 4)
    {
        int32_t const step = indices[1] - indices[0];
        bool evenlySpaced = step > 1;
        for (size_t i = 2; i < indices.size() && evenlySpaced; ++i)
        {
            evenlySpaced = indices[i] - indices[i - 1] == step;
        }
        if (evenlySpaced)
        {
            return fmt::format("{}, {}, ..., {}", indices[0], indices[1], indices.back());
        }
    }
    std::string text;
    for (size_t first = 0; first < indices.size();)
    {
        size_t last = first;
        while (last + 1 < indices.size() && indices[last + 1] == indices[last] + 1)
        {
            ++last;
        }
        text += text.empty() ? "" : ", ";
        text += first == last ? fmt::format("{}", indices[first]) : fmt::format("{}-{}", indices[first], indices[last]);
        first = last + 1;
    }
    return text;
}

//! Returns ascending indices as text, as formatRuns does, or as "0-61 except 5, 11, ..., 59" when that is shorter.
std::string formatIndices(std::vector<int32_t> const& indices)
{
    std::string const runs = formatRuns(indices);
    if (indices.size() < 4)
    {
        return runs;
    }
    std::vector<int32_t> missing;
    for (int32_t i = indices.front(), next = 0; i <= indices.back(); ++i)
    {
        if (indices[static_cast<size_t>(next)] == i)
        {
            ++next;
        }
        else
        {
            missing.push_back(i);
        }
    }
    if (missing.empty())
    {
        return runs;
    }
    std::string const complement = fmt::format("{}-{} except {}", indices.front(), indices.back(), formatRuns(missing));
    return complement.size() < runs.size() ? complement : runs;
}

std::string formatShape(std::array<int64_t, 5> const& dims)
{
    return fmt::format("[{}, {}, {}, {}, {}]", dims[0], dims[1], dims[2], dims[3], dims[4]);
}

TextTable::TextTable(std::vector<std::string> header, std::vector<bool> rightAligned)
    : mRightAligned(std::move(rightAligned))
{
    mRows.push_back(std::move(header));
}

void TextTable::addRow(std::vector<std::string> row)
{
    mRows.push_back(std::move(row));
}

std::string TextTable::render(std::string_view indent) const
{
    std::vector<size_t> widths(mRows.front().size(), 0);
    for (auto const& row : mRows)
    {
        for (size_t c = 0; c < row.size(); ++c)
        {
            widths[c] = std::max(widths[c], row[c].size());
        }
    }
    std::vector<std::string> rule;
    for (size_t const width : widths)
    {
        rule.emplace_back(width, '-');
    }
    std::string text;
    for (size_t r = 0; r < mRows.size(); ++r)
    {
        text += renderRow(indent, mRows[r], widths);
        if (r == 0)
        {
            text += renderRow(indent, rule, widths);
        }
    }
    return text;
}

std::string TextTable::renderRow(
    std::string_view indent, std::vector<std::string> const& row, std::vector<size_t> const& widths) const
{
    std::string line(indent);
    for (size_t c = 0; c < row.size(); ++c)
    {
        line += c == 0 ? "" : "  ";
        line += mRightAligned[c] ? fmt::format("{:>{}}", row[c], widths[c]) : fmt::format("{:<{}}", row[c], widths[c]);
    }
    while (!line.empty() && line.back() == ' ')
    {
        line.pop_back();
    }
    return line + "\n";
}

//! Returns `text` broken into lines of at most `width` characters at spaces, the first after `first` and the others
//! after `indent`, each ending in a newline.
std::string wrapText(std::string_view text, std::string_view first, std::string_view indent, size_t width)
{
    std::string out(first);
    size_t lineLength = first.size();
    bool lineEmpty = true;
    while (!text.empty())
    {
        size_t const space = text.find(' ');
        std::string_view const word = text.substr(0, space);
        text = space == std::string_view::npos ? std::string_view{} : text.substr(space + 1);
        if (!lineEmpty && lineLength + 1 + word.size() > width)
        {
            out += "\n";
            out += indent;
            lineLength = indent.size();
            lineEmpty = true;
        }
        if (!lineEmpty)
        {
            out += ' ';
            ++lineLength;
        }
        out += word;
        lineLength += word.size();
        lineEmpty = false;
    }
    return out + "\n";
}

//! Returns part / whole as a percentage with one decimal, e.g. "35.9%".
std::string formatPercent(int64_t part, int64_t whole)
{
    return whole == 0 ? std::string("0.0%")
                      : fmt::format("{:.1f}%", 100.0 * static_cast<double>(part) / static_cast<double>(whole));
}

} // namespace detail

std::string formatBytes(int64_t bytes)
{
    std::string const digits = fmt::format("{}", bytes < 0 ? -bytes : bytes);
    std::string text = bytes < 0 ? "-" : "";
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

std::string formatSize(int64_t bytes)
{
    std::array<char const*, 6> const units = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    size_t unit = 0;
    int64_t scale = 1;
    while (unit + 1 < units.size() && bytes / scale >= 1024)
    {
        scale *= 1024;
        ++unit;
    }
    if (unit == 0)
    {
        return fmt::format("{} B", bytes);
    }
    return fmt::format("{:.2f} {}", static_cast<double>(bytes) / static_cast<double>(scale), units[unit]);
}

} // namespace kvcache::plan
