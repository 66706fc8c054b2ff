# Validation loss and smoothed train loss vs step, one colour per optimizer format, and each
# format's validation loss relative to fp32's, from the eval-step CSV that run.sh writes
# (step, then <config>_train and <config>_val per config; <config>_train is the mean train loss
# of the steps since the previous evaluation).
# Usage: gnuplot -c bench/convergence/plot.gp CSV OUT.svg TITLE "fp32 bf16 q8 ..."
csv = ARG1; out = ARG2; title = ARG3; cfgs = ARG4
n = words(cfgs)
color(c) = c eq "fp32" ? "#000000" : c eq "bf16" ? "#1f77b4" : c eq "q8" ? "#d62728" : \
           c eq "bf16sr" ? "#2ca02c" : c eq "bf16sr_q8" ? "#ff7f0e" : "#7f7f7f"
has_fp32 = strstrt(" ".cfgs." ", " fp32 ") > 0

set terminal svg size 900,800 dynamic font "sans,13" background "white"
set output out
set datafile separator ","
set datafile columnheaders
set grid lc rgb "#dddddd"
set key top right noenhanced
set xrange [0:*]
set multiplot layout 2,1 title title noenhanced

set ylabel "loss (nats per byte)"
set xlabel "step"
set label 1 "solid: validation loss; dashed: train loss, mean since the previous evaluation" \
    at graph 0.02, graph 0.05 left font "sans,11"
plot for [i=1:n] csv using 1:(column(word(cfgs, i)."_val")) with linespoints lw 2 pt 7 ps 0.5 \
         lc rgb color(word(cfgs, i)) title word(cfgs, i), \
     for [i=1:n] csv using 1:(column(word(cfgs, i)."_train")) with lines lw 1 dt 2 \
         lc rgb color(word(cfgs, i)) notitle
unset label 1

set ylabel "val loss vs fp32 (%)"
set yrange [* < -2 : 2 < *]  # at least ±2%, more if a config strays further
set key tmargin center horizontal  # above the panel: the curves can be anywhere in it
if (has_fp32) {
  plot 1 with lines lc rgb "#999999" dt 3 title "±1%", -1 with lines lc rgb "#999999" dt 3 notitle, \
       for [i=1:n] csv using 1:(100 * (column(word(cfgs, i)."_val") / column("fp32_val") - 1)) \
           with linespoints lw 2 pt 7 ps 0.5 lc rgb color(word(cfgs, i)) title word(cfgs, i)
} else {
  set label 2 "no fp32 baseline in this run" at graph 0.5, graph 0.5 center
  plot NaN notitle
}
unset multiplot
