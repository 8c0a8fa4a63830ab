// Field values from text (internal): what the importers share to turn a
// WebDataset member's or a JSONL token's text into a typed FieldValue.
#pragma once

#include <functional>
#include <string>
#include <string_view>

#include "stoker/format.h"
#include "stoker/import.h"

namespace stoker::import {

// The field's name for a WebDataset extension: every character outside
// [A-Za-z0-9_] made '_' ("seg.png" -> "seg_png").
std::string FieldNameForExt(std::string_view ext);

// Parses decimal text (surrounding ASCII whitespace allowed, as a .cls
// member's trailing newline) as an int64 or a double. false when it is not
// one number.
bool ParseInt64Text(std::string_view text, int64_t* out);
bool ParseDoubleText(std::string_view text, double* out);

// The created_by of an imported dataset: "stoker VERSION import KIND".
std::string CreatedBy(std::string_view kind);

// Cancelled naming `what` and how far it got, when options.cancelled says so.
Status CheckCancelled(const std::function<bool()>& cancelled, const std::string& what,
                      const ImportProgress& progress);

// Closes the writer (the commit) into result->manifest, sets
// result->samples, and reports the final progress.
Status Finish(DatasetWriter& writer, const std::function<void(const ImportProgress&)>& report,
              ImportProgress* progress, ImportResult* result);

}  // namespace stoker::import
