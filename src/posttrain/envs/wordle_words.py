"""Five-letter English words for the Wordle environment (common words, written for this project)."""

WORDS = tuple("""
about above actor acute admit adopt adult after again agent agree ahead alarm album alert alike alive allow
alone along alter among anger angle angry apart apple apply arena argue arise array aside asset avoid award
aware badly baker basic beach begin being below bench birth black blade blame blind block blood board boost
booth bound brain brand bread break breed brief bring broad brown build built buyer cable camel carry catch
cause chain chair chart chase cheap check chest chief child china chose civil claim class clean clear climb
clock close cloud coach coast count court cover craft crash cream crime cross crowd crown curve cycle daily
dance dated dealt death delay depth dirty doubt dozen draft drama drawn dream dress drink drive eager early
earth eight elite empty enemy enjoy enter entry equal error event every exact exist extra faith false fault
fiber field fifth fifty fight final first flash fleet floor fluid focus force forth forty forum found frame
frank fresh front fruit fully funny giant given glass globe grace grade grand grant grass great green gross
group grown guard guess guest guide happy heart heavy hence horse hotel house human ideal image index inner
input issue joint judge knife known label large laser later laugh layer learn lease least leave legal lemon
level light limit local logic loose lucky lunch magic major maker march match maybe mayor meant media metal
might minor minus mixed model money month moral motor mount mouse mouth movie music needs never night noise
north noted novel nurse ocean offer often order other outer owner paint panel paper party peace phase phone
photo piece pilot pitch place plain plane plant plate point pound power press price pride prime print prior
prize proof proud prove queen quick quiet quite radio raise range rapid ratio reach ready refer relax reply
right river robot rough round route royal rural scale scene scope score sense serve seven shall shape share
sharp sheet shelf shell shift shirt shock shoot short shown sight skill sleep slide small smart smile smoke
solid solve sorry sound south space spare speak speed spend spent split sport staff stage stake stand start
state steam steel stick still stock stone stood store storm story strip stuck study stuff style sugar suite
super sweet table taken taste teach thank theme there thick thing think third those three throw tight timer
title today topic total touch tough tower track trade train treat trend trial tried truck truly trust truth
twice under union unity until upper upset urban usage usual valid value video virus visit vital voice waste
watch water wheel where which while white whole whose woman world worry worth would wound write wrong youth
""".split())
