# A workload for perl: regular expressions, hashes, sorting, sprintf, pack,
# closures, string operations, local arrays, eval/die. Waits for one line on
# stdin first, so a tracer can attach before the work starts.
use strict;
use warnings;

my $go = <STDIN>;
my @out;
my %count;
my $text = join " ", map { sprintf "word%03d item-%d", $_ % 97, $_ * 7 } 1 .. 5000;
$count{$1}++ while $text =~ /(word\d+)/g;
push @out, scalar(keys %count), join(",", (sort { $count{$b} <=> $count{$a} || $a cmp $b } keys %count)[0 .. 4]);
my @nums = map { ($_ * 7919) % 10007 } 1 .. 20000;
my @sorted = sort { $a <=> $b } @nums;
push @out, "@sorted[0 .. 9]", $sorted[-1];
my $sum = 0;
$sum += $_ for @nums;
push @out, $sum;
push @out, unpack("H*", pack("NnC a4", 0xdeadbeef, 513, 7, "perl"));
my @adders = map { my $n = $_; sub { $_[0] + $n } } 1 .. 10;
push @out, join(" ", map { $_->(100) } @adders);
(my $s = "The quick brown fox jumps over the lazy dog") =~ s/(\w+)/\u\L$1/g;
push @out, $s, scalar reverse($s), lc($s) =~ tr/a-z//;
my %h = map { ("k$_" => [$_, $_ ** 2, { sq => $_ * $_ }]) } 1 .. 3000;
my $total = 0;
$total += $h{$_}[2]{sq} for sort keys %h;
push @out, $total;
eval { die { code => 42 } };
push @out, "caught $@->{code}";
push @out, join("|", split /,\s*/, "a, b,c,   d");
push @out, sprintf("%.6f %e %x %o %s", 3.14159265, 12345.678, 255, 8, "x" x 5);
my @matrix = map { [map { $_ * 2 } 1 .. 50] } 1 .. 50;
my $diag = 0;
$diag += $matrix[$_][$_] for 0 .. 49;
push @out, $diag;
print join("\n", @out), "\n";
