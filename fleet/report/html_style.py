"""report.html's style sheet, inline in the page: system fonts only, the status colours of the badges, the
memory buckets of the rack grid (`m0`..`m4`, `na`, `gone`), the health outlines (`hf` fails, `hw` warns) and
the timeline's colours (`wait`: a Slurm wait; the steps: `pre`, `drain`, `kill`, `settle`, `verify`, `bad`)."""

CSS = """
body{font:13px/1.4 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;margin:16px 24px;color:#212529;
background:#fff}h1{font-size:20px;margin:0 0 4px}h1 .id{font-family:ui-monospace,monospace;font-weight:normal}
h2{font-size:15px;margin:22px 0 6px;border-bottom:1px solid #dee2e6}.meta,.legend,footer{color:#495057}
.legend span{margin-left:10px;white-space:nowrap}.legend i{display:inline-block;width:12px;height:12px;
margin-right:3px;vertical-align:-2px}.verdict{font-size:17px;font-weight:600;margin:6px 0}.verdict.ok{color:#2b8a3e}
.verdict.bad{color:#c92a2a}.note{color:#c92a2a}ul.counts{list-style:none;padding:0;margin:4px 0}
ul.counts li{display:inline-block;margin-right:6px}.badge{padding:1px 6px;border-radius:3px;font-weight:600}
.s-clean{background:#d3f9d8;color:#2b8a3e}.s-failed{background:#ffe3e3;color:#c92a2a}
.s-unreachable{background:#ffe8cc;color:#d9480f}.s-skipped{background:#e9ecef;color:#495057}
.s-planned{background:#e7f5ff;color:#1864ab}.s-other{background:#f3f0ff;color:#5f3dc4}
table{border-collapse:collapse}td,th{text-align:left;vertical-align:top}.outcome td,.outcome th,table.small td,
table.small th{padding:2px 8px;border-bottom:1px solid #f1f3f5}.num{text-align:right;white-space:nowrap}
.set{font-family:ui-monospace,monospace}
.grid th,.grid td,.timeline th,.timeline td{padding:0 4px 0 0;white-space:nowrap;font-weight:normal}
.grid td.st{font-size:11px;padding:0 6px;border-radius:0}.grid td.c{padding:0;border:2px solid #fff}
.grid td.c i{display:block;width:22px;height:11px}.grid td.c i.b{height:4px;border-bottom:1px solid #fff}
.grid td.c i.w{height:16px}
.grid td.hf{outline:2px solid #e03131;outline-offset:-2px}.grid td.hw{outline:2px dashed #f08c00;outline-offset:-2px}
.hf-s{outline:2px solid #e03131;outline-offset:-2px}.hw-s{outline:2px dashed #f08c00;outline-offset:-2px}
.mark{color:#fff;background:#e03131;border-radius:6px;padding:0 4px;margin-left:3px;font-size:10px}
.mark.hw{background:#f08c00}.odd{color:#fff;background:#7048e8;border-radius:6px;padding:0 4px;margin-left:3px;
font-size:10px;font-weight:400}.none{color:#868e96;font-style:italic}
.m0{background:#b2f2bb}.m1{background:#fff3bf}.m2{background:#ffc078}.m3{background:#f76707}.m4{background:#a61e4d}
.na{background:repeating-linear-gradient(45deg,#adb5bd 0 2px,#f1f3f5 2px 4px)}.gone{background:#343a40}
.timeline{width:100%}.timeline th{width:1%}.timeline td.num{width:1%;padding:0 6px;font-size:11px}
td.bar{width:98%;padding:0;background-image:linear-gradient(to right,#dee2e6 1px,transparent 1px);
background-repeat:repeat-x;background-size:var(--tick) 100%}
td.bar svg{display:block}td.idle{color:#868e96;font-style:italic;font-size:11px}
.ticks{position:relative;height:14px;font-size:10px;color:#868e96}.ticks span{position:absolute;top:0}
rect.wait,i.wait{fill:#ffd43b;background:#ffd43b}
rect.pre,i.pre{fill:#ced4da;background:#ced4da}rect.drain,i.drain{fill:#4dabf7;background:#4dabf7}
rect.kill,i.kill{fill:#9775fa;background:#9775fa}rect.settle,i.settle{fill:#38d9a9;background:#38d9a9}
rect.verify,i.verify{fill:#69db7c;background:#69db7c}rect.bad,i.bad{fill:#e03131;background:#e03131}
rect.other{fill:#adb5bd}details{margin:2px 0;padding:2px 6px;border-left:3px solid #dee2e6}
details[open]{border-left-color:#868e96;padding-bottom:6px}summary{cursor:pointer}.err{color:#c92a2a;margin:4px 0}
table.small{margin:4px 0;font-size:12px}table.small th{color:#495057;font-weight:600}.log{font-family:ui-monospace,
monospace;font-size:12px;color:#495057;margin:4px 0}.slurm{margin:4px 0}footer{margin-top:24px;font-size:11px}
"""
