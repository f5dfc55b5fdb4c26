#!/usr/bin/perl
# What the Rust files of src/ import, for .ci/check-arch-boundary. Every
# path through `crate::`, `tp::`, `self::` or `super::` (any number of
# them, counted from the file's module and the inline modules it sits in)
# is read as the absolute path it names, braces expanded (`crate::{a::b,
# c}`); comments, string literals and macros (`crate::say!`) are left out.
#
#   imports.pl FILE MODULE_PATH     The top-level modules of src/ that one
#                                   file refers to, one per line
#                                   (MODULE_PATH: `symbols::elf`, or
#                                   `symbols` for src/symbols/mod.rs).
#   imports.pl --cycles SRC_DIR [ALLOWED...]
#                                   Inside each module with files of its
#                                   own (src/symbols/, src/arch/x86_64/...),
#                                   the import cycles between its files
#                                   (a subdirectory counts as one file),
#                                   one line each; nothing when none. An
#                                   ALLOWED import, `MODULE FROM TO`
#                                   (`probe region install`), is left out
#                                   of the graph; one that no file makes
#                                   any more is reported, to be taken off.
#   imports.pl --self-test
#
# Inside a module, a name its root file (mod.rs) re-exports or imports
# (`pub use elf::ElfFile;`) counts as the file it comes from; the root's
# own items belong to no file and make no edge.
use strict;
use warnings;

sub strip {
    my ($s) = @_;
    # (Newlines are kept, for the line numbers of --cycles.)
    my $lines = sub { "\n" x (() = $_[0] =~ /\n/g) };
    $s =~ s{/\*.*?\*/}{' ' . $lines->($&)}gse;
    $s =~ s{//[^\n]*}{}g;
    $s =~ s{r(#*)".*?"\1}{'""' . $lines->($&)}gse;
    $s =~ s{"(?:[^"\\]|\\.)*"}{'""' . $lines->($&)}gse;
    $s =~ s{'(?:[^'\\]|\\.)'}{' '}g;
    return $s;
}

my $ident = qr/[A-Za-z_][A-Za-z0-9_]*/;

# The paths of a use tree (or an expression's path) starting at $pos: each
# a list of segments, `{a::b, c}` expanded; `name as alias` gives the
# path with the alias after a `=`. Returns the paths and the position
# after the tree.
sub tree {
    my ($s, $pos) = @_;
    substr($s, $pos) =~ /^\s*/;
    $pos += length $&;
    if (substr($s, $pos, 1) eq '{') {
        $pos++;
        my @out;
        while ($pos < length $s) {
            substr($s, $pos) =~ /^[\s,]*/;
            $pos += length $&;
            if (substr($s, $pos, 1) eq '}') { $pos++; last }
            my ($paths, $after) = tree($s, $pos);
            push @out, @$paths;
            # Skip what this item has left (`as x`, generics) up to its end.
            my $depth = 0;
            $pos = $after;
            while ($pos < length $s) {
                my $c = substr($s, $pos, 1);
                last if $depth == 0 && ($c eq ',' || $c eq '}');
                $depth++ if $c eq '{';
                $depth-- if $c eq '}';
                $pos++;
            }
        }
        return (\@out, $pos);
    }
    if (substr($s, $pos) =~ /^\*/) {
        return ([['*']], $pos + 1);
    }
    if (substr($s, $pos, 100) =~ /^($ident)(\s*!)?/) {
        # (A macro, `crate::say!`, is no module.)
        return ([], $pos + length $&) if defined $2;
        my $name = $1;
        $pos += length $name;
        if (substr($s, $pos, 200) =~ /^\s*::\s*(?=[A-Za-z_{*])/) {
            $pos += length $&;
            my ($rest, $after) = tree($s, $pos);
            return ([map { [$name, @$_] } @$rest], $after) if @$rest;
            return ([[$name]], $after);
        }
        if (substr($s, $pos, 100) =~ /^\s+as\s+($ident)/) {
            return ([[$name, "=$1"]], $pos + length $&);
        }
        return ([[$name]], $pos);
    }
    return ([], $pos);
}

# Every absolute path (a list of segments; a last one `=alias` for `as`)
# that the text of the file of module $modpath names, with where: a list
# of [segments, line].
sub paths {
    my ($text, $modpath) = @_;
    my $s = strip($text);
    my @file = grep { length } split /::/, $modpath;
    my (@inline, @out);    # inline modules: [name, brace depth at its `{`]
    my $depth = 0;
    my $pos = 0;
    my $len = length $s;
    while ($pos < $len) {
        my $rest = substr($s, $pos, 200);
        if ($rest =~ /^\bmod\s+($ident)\s*\{/ && ($pos == 0 || substr($s, $pos - 1, 1) !~ /\w/)) {
            push @inline, [$1, $depth];
            $depth++;
            $pos += length $&;
            next;
        }
        my $c = substr($s, $pos, 1);
        if ($c eq '{') { $depth++; $pos++; next }
        if ($c eq '}') {
            $depth--;
            pop @inline if @inline && $inline[-1][1] == $depth;
            $pos++;
            next;
        }
        if (($pos == 0 || substr($s, $pos - 1, 1) !~ /[\w:]/) && $rest =~ /^((?:crate|tp|self|super)(?:\s*::\s*super)*)\s*::\s*/) {
            my ($head, $skip) = ($1, length $&);
            my @base;
            if ($head =~ /^(crate|tp)/) {
                @base = ();
            } else {
                @base = (@file, map { $_->[0] } @inline);
                my $supers = () = $head =~ /super/g;
                @base = $supers > @base ? () : @base[0 .. $#base - $supers];
            }
            my $line = 1 + (() = substr($s, 0, $pos) =~ /\n/g);
            my ($found, $after) = tree($s, $pos + $skip);
            for my $p (@$found) {
                my @abs = (@base, @$p);
                # `self` in a group names the path before it.
                @abs = grep { $_ ne 'self' } @abs;
                push @out, [\@abs, $line] if @abs;
            }
            $pos = $after > $pos ? $after : $pos + $skip;
            next;
        }
        $pos++;
    }
    return @out;
}

# The top-level modules (other than the file's own) that a file refers to.
sub imports {
    my ($text, $modpath) = @_;
    my $top = (grep { length } split /::/, $modpath)[0] // '';
    my %out;
    for my $p (paths($text, $modpath)) {
        my $m = $p->[0][0];
        $out{$m} = 1 unless $m eq $top || $m !~ /^[a-z_][a-z0-9_]*$/;
    }
    return sort keys %out;
}

# --- Cycles between the files of a module --------------------------------

# For the module $dir (a path under src/, `symbols`) of the tree %$files
# (path under src/ => text): its children (files and subdirectories, by
# name) and the names its root file brings in from a child (name => child).
sub children_of {
    my ($files, $dir) = @_;
    my (%children, %names);
    for my $f (keys %$files) {
        next unless $f =~ m{^\Q$dir\E/([a-z_0-9]+)(\.rs$|/)};
        next if $1 eq 'mod' && $2 eq '.rs';
        $children{$1} = 1;
    }
    my $root = exists $files->{"$dir/mod.rs"} ? "$dir/mod.rs" : "$dir.rs";
    my $modpath = $dir =~ s{/}{::}gr;
    if (exists $files->{$root}) {
        my $s = strip($files->{$root});
        # `use child::X;`, `pub use child::{X, Y as Z};`, `pub(crate) use self::child::X;`
        while ($s =~ /\buse\s+(?=(?:self\s*::\s*)?[a-z_])/g) {
            my $at = pos $s;
            substr($s, $at) =~ /^self\s*::\s*/ and $at += length $&;
            my ($found) = tree($s, $at);
            for my $p (@$found) {
                my ($child, @rest) = @$p;
                next unless $children{$child} && @rest;
                my $name = $rest[-1] =~ /^=(.*)/ ? $1 : $rest[-1];
                $names{$name} = $child unless $name eq '*' || $name eq 'self';
            }
        }
    }
    return (\%children, \%names);
}

# Every import cycle between the children of each module of %$files: one
# line each, `symbols: import cycle between its files: elf -> eh -> elf
# (src/symbols/elf.rs:392, src/symbols/eh.rs:17)`;
# the imports of @allowed (`MODULE FROM TO`) left out.
sub cycles {
    my ($files, @allowed) = @_;
    my %allowed = map { join(' ', split ' ') => 0 } @allowed;
    my %dirs;
    for my $f (keys %$files) {
        my @parts = split m{/}, $f;
        $dirs{join '/', @parts[0 .. $_]} = 1 for 0 .. $#parts - 1;
    }
    my @report;
    for my $dir (sort keys %dirs) {
        my ($children, $names) = children_of($files, $dir);
        next unless %$children;
        my @mod = split m{/}, $dir;
        my (%edge, %where);
        for my $f (sort keys %$files) {
            next unless $f =~ m{^\Q$dir\E/([a-z_0-9]+)(\.rs$|/)} && !($1 eq 'mod' && $2 eq '.rs');
            my $from = $1;
            my $modpath = $f =~ s{\.rs$}{}r =~ s{/mod$}{}r =~ s{/}{::}gr;
            for my $p (paths($files->{$f}, $modpath)) {
                my @abs = @{ $p->[0] };
                next unless @abs > @mod && join('/', @abs[0 .. $#mod]) eq $dir;
                my $next = $abs[@mod] =~ s/^=//r;
                my $to = $children->{$next} ? $next : $names->{$next};
                next unless defined $to && $to ne $from;
                my $key = ($dir =~ s{/}{::}gr) . " $from $to";
                if (exists $allowed{$key}) {
                    $allowed{$key}++;
                    next;
                }
                $edge{$from}{$to} = 1;
                $where{"$from $to"} //= "src/$f:$p->[1]";
            }
        }
        # Each cycle once, from its smallest name, shortest first.
        my %seen;
        for my $start (sort keys %edge) {
            my @queue = ([$start]);
            my %reached;
            while (my $path = shift @queue) {
                for my $to (sort keys %{ $edge{ $path->[-1] } // {} }) {
                    if ($to eq $start) {
                        my @c = (@$path, $start);
                        my $key = join ' ', sort @$path;
                        next if $seen{$key}++;
                        my @w = map { $where{"$c[$_] $c[$_ + 1]"} } 0 .. $#c - 1;
                        push @report, ($dir =~ s{/}{::}gr) . ": import cycle between its files: " . join(' -> ', @c) . " (" . join(', ', @w) . ")";
                        next;
                    }
                    next if $to lt $start || $reached{$to}++;
                    push @queue, [@$path, $to];
                }
            }
        }
    }
    for my $a (sort keys %allowed) {
        my ($m, $from, $to) = split ' ', $a;
        push @report, "$m: $from no longer imports $to; take `$a` off the allowed imports" unless $allowed{$a};
    }
    return @report;
}

if (@ARGV && $ARGV[0] eq '--self-test') {
    my @cases = (
        ["use crate::session::Options;", "arch::plan", "session"],
        ["use crate::{session::Options, probe};", "arch::plan", "probe session"],
        ["use crate::{\n    events::{a, b},\n    output::x,\n};", "arch", "events output"],
        ["fn f() { super::super::session::go(); }", "arch::plan", "session"],
        ["fn f() { super::super::session::go(); }", "arch::x86_64::plan", ""],
        ["mod tests { use super::super::debuginfo::find; }", "symbols::dwarf_index", ""],
        ["mod tests { use super::super::super::cache::x; }", "symbols::dwarf_index", "cache"],
        ["// use crate::session;\nlet s = \"crate::session\";", "arch", ""],
        ["tp::cli::run(); self::x::y();", "main", "cli"],
        ["use super::{probe, session};", "arch", "probe session"],
        ["crate::say!(\"x\"); tp::say!(\"y\");", "cmd::run", ""],
        ["use crate::{self as tp2, session::{self, Options as O}};", "arch", "session"],
    );
    my $bad = 0;
    for my $c (@cases) {
        my $got = join ' ', imports($c->[0], $c->[1]);
        if ($got ne $c->[2]) {
            print STDERR "imports.pl self-test: `$c->[0]` in $c->[1]: got `$got`, want `$c->[2]`\n";
            $bad = 1;
        }
    }
    # Trees of files, and the cycles between files of one module they have.
    my $m = "pub mod eh;\npub mod elf;\npub mod util;\npub use elf::{ElfFile, Sym as Symbol};\npub struct Function;\n";
    my @trees = (
        # Through a name the root re-exports, and by a direct path.
        [{ 'sy/mod.rs' => $m, 'sy/eh.rs' => "use super::ElfFile;", 'sy/elf.rs' => "fn f() { super::eh::fde(); }" },
            "sy: import cycle between its files: eh -> elf -> eh (src/sy/eh.rs:1, src/sy/elf.rs:1)"],
        # Braces, `crate::`, an alias, a test module's `super::*`.
        [{ 'sy/mod.rs' => $m, 'sy/eh.rs' => "use crate::sy::{Symbol, util};\nmod tests { use super::*; }",
                'sy/elf.rs' => "use crate::sy::{\n    eh::X,\n};" },
            "sy: import cycle between its files: eh -> elf -> eh (src/sy/eh.rs:1, src/sy/elf.rs:1)"],
        # One way only, the root's own items, and comments: no cycle.
        [{ 'sy/mod.rs' => $m, 'sy/eh.rs' => "use super::{ElfFile, Function};", 'sy/elf.rs' => "use super::Function; // super::eh::x" },
            ""],
        # A subdirectory is one file of its parent; `super::super` from inside it.
        [{ 'a/mod.rs' => "pub mod b;\npub mod d;", 'a/b/mod.rs' => "pub mod c;", 'a/b/c.rs' => "use super::super::d::Y;",
                'a/d.rs' => "use super::b::c::Z;" },
            "a: import cycle between its files: b -> d -> b (src/a/b/c.rs:1, src/a/d.rs:1)"],
        # A root as `dir.rs` beside `dir/`; three files around.
        [{ 'p/region.rs' => "mod create;\nmod grow;\nmod shrink;\npub use shrink::Shrink;", 'p/region/create.rs' => "use super::grow::x;",
                'p/region/grow.rs' => "use super::Shrink;", 'p/region/shrink.rs' => "use crate::p::region::create::y;" },
            "p::region: import cycle between its files: create -> grow -> shrink -> create (src/p/region/create.rs:1, src/p/region/grow.rs:1, src/p/region/shrink.rs:1)"],
        # An allowed import breaks the cycle; one that is gone is said.
        [{ 'sy/mod.rs' => $m, 'sy/eh.rs' => "use super::ElfFile;", 'sy/elf.rs' => "fn f() { super::eh::fde(); }" },
            "", "sy elf eh"],
        [{ 'sy/mod.rs' => $m, 'sy/eh.rs' => "use super::ElfFile;", 'sy/elf.rs' => "" },
            "sy: util no longer imports eh; take `sy util eh` off the allowed imports", "sy util eh"],
    );
    for my $t (@trees) {
        my $got = join "\n", cycles($t->[0], @$t[2 .. $#$t]);
        if ($got ne $t->[1]) {
            print STDERR "imports.pl self-test: cycles of {", join(', ', sort keys %{ $t->[0] }), "}: got `$got`, want `$t->[1]`\n";
            $bad = 1;
        }
    }
    exit $bad;
}

if (@ARGV >= 2 && $ARGV[0] eq '--cycles') {
    my (undef, $src, @allowed) = @ARGV;
    my %files;
    for my $f (split /\n/, `git ls-files --cached --others --exclude-standard -- '$src'`) {
        next unless $f =~ m{^\Q$src\E/(.+\.rs)$};
        open my $fh, '<', $f or die "imports.pl: $f: $!\n";
        local $/;
        $files{$1} = <$fh>;
    }
    print "$_\n" for cycles(\%files, @allowed);
    exit 0;
}

my ($file, $modpath) = @ARGV;
open my $fh, '<', $file or die "imports.pl: $file: $!\n";
local $/;
my $text = <$fh>;
print "$_\n" for imports($text, $modpath);
