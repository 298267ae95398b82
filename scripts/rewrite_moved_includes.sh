#!/usr/bin/env bash
# Rewrites the paths of the headers that moved into layer folders (issue 33; docs/CHANGELOG.md,
# "Moved headers") in the given files, in place: includes ("tangram/OLD" -> "tangram/NEW") and
# bare mentions of the old path (@file lines, prose). Idempotent: running it twice changes nothing.
#   scripts/rewrite_moved_includes.sh FILE...
#   git ls-files -z '*.hpp' '*.cuh' '*.inl' '*.cpp' '*.cu' '*.md' | xargs -0 scripts/rewrite_moved_includes.sh
set -euo pipefail
[ $# -gt 0 ] || { echo "usage: $0 FILE..." >&2; exit 2; }
# old path -> new path, under include/tangram/ (eval/...: under eval/include/tangram/)
perl -pi -e '
  BEGIN {
    @moves = (
      "config.hpp" => "core/config.hpp",
      "error.hpp" => "core/error.hpp",
      "version.hpp" => "core/version.hpp",
      "dtype.hpp" => "core/dtype.hpp",
      "numeric.hpp" => "core/numeric.hpp",
      "detail/str.hpp" => "core/detail/str.hpp",
      "detail/checked_math.hpp" => "core/detail/checked_math.hpp",
      "detail/stats.hpp" => "plan/detail/stats.hpp",
      "detail/json.hpp" => "io/detail/json.hpp",
      "detail/json/dump.hpp" => "io/detail/json/dump.hpp",
      "detail/json/node.hpp" => "io/detail/json/node.hpp",
      "detail/json/parse.hpp" => "io/detail/json/parse.hpp",
      "detail/json/value.hpp" => "io/detail/json/value.hpp",
      "detail/file_io.hpp" => "io/detail/file_io.hpp",
      "plan/retention.hpp" => "core/retention.hpp",
      "memory/page_layout.hpp" => "core/page_layout.hpp",
      "memory/kv_view.hpp" => "core/kv_view.hpp",
      "device/device_limits.hpp" => "core/device_limits.hpp",
      "kernels/stream.hpp" => "core/stream.hpp",
      "kernels/elastic_lengths.hpp" => "core/elastic_lengths.hpp",
      "reference/elastic_selection.hpp" => "plan/elastic_selection.hpp",
      "eval/sim/workload_io.hpp" => "eval/io/workload_io.hpp",
    );
  }
  for (my $i = 0; $i < @moves; $i += 2) {
    my ($old, $new) = (quotemeta($moves[$i]), $moves[$i + 1]);
    s{(?<=tangram/)$old(?![\w.])}{$new}g;          # "tangram/OLD" (includes, full paths)
    s{(?<![\w/.-])$old(?![\w.])}{$new}g;           # "OLD" alone (@file lines, prose)
  }
' "$@"
