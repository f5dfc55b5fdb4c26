#!/usr/bin/perl
# The top-level modules of src/ that one Rust file refers to, one per line:
# every path through `crate::`, `tp::`, `self::` or `super::` (any number
# of them, counted from the file's module and the inline modules it sits
# in), braces included (`crate::{a::b, c}`). Comments and string literals
# are left out. Used by .ci/check-arch-boundary.
#
#   imports.pl FILE MODULE_PATH     (MODULE_PATH: `symbols::elf`, or
#                                    `symbols` for src/symbols/mod.rs)
#   imports.pl --self-test
use strict;
use warnings;

sub strip {
    my ($s) = @_;
    $s =~ s{/\*.*?\*/}{ }gs;
    $s =~ s{//[^\n]*}{}g;
    $s =~ s{r(#*)".*?"\1}{""}gs;
    $s =~ s{"(?:[^"\\]|\\.)*"}{""}gs;
    $s =~ s{'(?:[^'\\]|\\.)'}{' '}g;
    return $s;
}

# The first identifier of each item of a brace group starting at $pos
# (just after its `{`), and the position after its `}`.
sub group_heads {
    my ($s, $pos) = @_;
    my ($depth, $want) = (1, 1);
    my @heads;
    while ($pos < length $s && $depth > 0) {
        my $c = substr($s, $pos, 1);
        if ($c eq '{') { $depth++; $pos++; next }
        if ($c eq '}') { $depth--; $pos++; next }
        if ($c eq ',' && $depth == 1) { $want = 1; $pos++; next }
        if ($want && $depth == 1 && substr($s, $pos) =~ /^([A-Za-z_][A-Za-z0-9_]*)/) {
            push @heads, $1;
            $want = 0;
            $pos += length $1;
            next;
        }
        $pos++;
    }
    return (\@heads, $pos);
}

sub imports {
    my ($text, $modpath) = @_;
    my $s = strip($text);
    my @file = grep { length } split /::/, $modpath;
    my $top = $file[0] // '';
    my (@inline, %out);    # inline modules: [name, brace depth at its `{`]
    my $depth = 0;
    my $pos = 0;
    my $len = length $s;
    while ($pos < $len) {
        my $rest = substr($s, $pos, 200);
        if ($rest =~ /^\bmod\s+([A-Za-z_][A-Za-z0-9_]*)\s*\{/ && ($pos == 0 || substr($s, $pos - 1, 1) !~ /\w/)) {
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
            $pos += $skip;
            my @names;
            if (substr($s, $pos, 1) eq '{') {
                my ($heads, $after) = group_heads($s, $pos + 1);
                @names = @$heads;
                $pos = $after;
            } elsif (substr($s, $pos, 100) =~ /^([A-Za-z_][A-Za-z0-9_]*)(\s*!)?/) {
                # (A macro, `crate::say!`, is no module.)
                @names = ($1) unless defined $2;
                $pos += length $1;
            }
            for my $n (@names) {
                my $m = @base ? $base[0] : $n;
                $out{$m} = 1 unless $m eq $top || $m eq 'self' || $m eq 'super' || $m !~ /^[a-z_][a-z0-9_]*$/;
            }
            next;
        }
        $pos++;
    }
    return sort keys %out;
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
    );
    my $bad = 0;
    for my $c (@cases) {
        my $got = join ' ', imports($c->[0], $c->[1]);
        if ($got ne $c->[2]) {
            print STDERR "imports.pl self-test: `$c->[0]` in $c->[1]: got `$got`, want `$c->[2]`\n";
            $bad = 1;
        }
    }
    exit $bad;
}

my ($file, $modpath) = @ARGV;
open my $fh, '<', $file or die "imports.pl: $file: $!\n";
local $/;
my $text = <$fh>;
print "$_\n" for imports($text, $modpath);
