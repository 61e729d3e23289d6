"""Generate ``heldout.json``: a held-out benchmark prompt set, reported separately.

Several things in this project are tuned on the benchmark prompts (``workloads.json``): the default
draft length K of each method, the draft-tree shapes, and the per-prompt router that picks a method
from benchmark timings. A speedup measured on the very prompts those choices were fitted to is
optimistic. The drafters, in turn, are trained on ``train_prompts.json``. This file is a third set,
kept apart from both: nothing is tuned or trained on it, so numbers measured on it are reported as
*held-out* figures, next to (never averaged into) the benchmark figures.

The set has the benchmark's seven categories, 6 prompts each (42), written in the benchmark's
style and at its lengths: earlier turns ending with a user turn, code to fix / explain / extend
or write, passages of a few hundred words to summarise, ``[Doc n]`` documents with a question,
open questions, word problems, and messy texts to rewrite or translate. Every passage, code
snippet, question, word problem and instruction below is original text written for this file, on
topics the other two sets do not use; ``tests/measure/test_workloads.py`` checks that no 12-word
window is shared with ``workloads.json`` or ``train_prompts.json``.

The prompts are literal text in a fixed order (no randomness), so the output is deterministic:

    python specdecode_ref/data/make_heldout_prompts.py          # rewrites data/heldout.json
    python specdecode_ref/data/make_heldout_prompts.py --check  # exit 1 if the file is stale

Load it with ``specdecode_ref.measure.harness.workloads.load_heldout`` (same arguments as
``load_workloads``); ids are ``heldout-<category>-NN``.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

OUT_PATH = Path(__file__).resolve().parent / "heldout.json"
CATEGORIES = ("multi_turn", "code", "summarization", "rag_qa", "qa", "math", "rewrite")
PER_CATEGORY = 6


def user(text: str) -> dict:
    return {"role": "user", "content": text}


def assistant(text: str) -> dict:
    return {"role": "assistant", "content": text}


# ---------------------------------------------------------------------------------------------
# multi_turn: earlier user/assistant turns, ending with a user turn (3 or 5 messages)
# ---------------------------------------------------------------------------------------------

MULTI_TURN = [
    [
        user("I'm 41 and I never learned to swim properly. I can float a little, but I panic as soon as my "
             "face goes under. Is it worth taking lessons at my age?"),
        assistant("Absolutely. Adult beginners are common, and many pools run small classes just for them. The "
                  "panic you describe is the usual starting point, so good instructors begin with breathing: "
                  "blowing bubbles, putting your face in while standing, and only then gliding. Most adults can "
                  "swim a relaxed length within a few months."),
        user("The pool near me offers either group lessons on Saturday mornings or private lessons that cost "
             "three times as much. Which would you pick for someone as nervous as me?"),
    ],
    [
        user("My daughter wants fish for her tenth birthday. We were thinking of a small bowl with a goldfish "
             "on her desk. Good idea?"),
        assistant("It's a lovely idea, but a bowl is a tough home for a goldfish. They grow bigger than most "
                  "people expect and produce a lot of waste, so the water turns toxic quickly. A filtered tank "
                  "of at least 40 liters with a few small tropical fish, such as neon tetras, or a single betta, "
                  "is much easier to keep healthy."),
        user("OK, we bought a 45-liter tank with a filter and a heater. The shop said we have to 'cycle' it "
             "before adding any fish. What does that mean?"),
        assistant("Cycling means growing the helpful bacteria that turn fish waste into less harmful "
                  "substances. You run the filter for a few weeks with a small source of ammonia, such as a "
                  "pinch of fish food every day, and test the water until ammonia and nitrite both read zero. "
                  "Skipping this step is the most common reason new fish die in their first month."),
        user("We're in week three and the nitrite reading is still high. Is something wrong, or do we just "
             "need to wait longer?"),
    ],
    [
        user("I just started working night shifts as a nurse, 7 p.m. to 7 a.m., three nights a week. I can't "
             "sleep more than four hours during the day. Any advice?"),
        assistant("Daytime sleep is hard because your body clock wants you awake when it's light. Make the "
                  "bedroom as dark as possible with blackout curtains or an eye mask, keep it cool, and use "
                  "earplugs or a fan to cover daytime noise. Wearing sunglasses on the drive home also stops "
                  "the morning light from waking you up completely."),
        user("I drink a lot of coffee to get through the night. Could that be part of the problem?"),
        assistant("Very likely. Caffeine stays in your system for many hours, so a cup at 4 a.m. can still be "
                  "working when you try to sleep at 8. Have your last coffee in the first half of the shift "
                  "and switch to water or decaf after that. A short nap before the shift can also cut down how "
                  "much caffeine you need."),
        user("What should I do on my days off? Should I switch back to sleeping at night or stay on the night "
             "schedule?"),
    ],
    [
        user("My grandmother passed away last spring and left a box of old letters and photos. I'd like to "
             "build a family tree from them. How do I begin?"),
        assistant("I'm sorry about your grandmother; a box like that is a real treasure. Start by sorting "
                  "everything by person and date, and note every name, place and date you find, even partial "
                  "ones. Talk to older relatives while you can, since they can identify faces and fill gaps. "
                  "A free genealogy program, or even a spreadsheet, keeps track of who connects to whom."),
        user("Several of the letters are written in Polish, which I don't speak, and some of the handwriting "
             "is hard to read. How can I figure out what they say?"),
    ],
    [
        user("My driving test is in three weeks. I'm fine on normal roads, but I keep messing up parallel "
             "parking. How can I practice it?"),
        assistant("Parallel parking is mostly about reference points. Pull up alongside the front car with "
                  "about half a meter between you, stop when your rear bumpers line up, then reverse slowly "
                  "with full lock toward the curb. When the car sits at roughly 45 degrees, straighten the "
                  "wheels, keep reversing, and steer the other way to bring the front in. Practice with cones "
                  "in an empty parking lot first."),
        user("That helped a lot, thanks. What are the most common reasons people fail the test?"),
        assistant("Examiners most often mark failures for poor observation at junctions, for not checking the "
                  "mirrors before changing speed or direction, and for going over the speed limit. Hesitating "
                  "too long at roundabouts and drifting out of the lane come up often as well. Nerves make all "
                  "of these worse, so a mock test with your instructor on the real routes is very useful."),
        user("What should I do if I stall the car during the test? Does that mean I fail automatically?"),
    ],
    [
        user("We want to start a weekly game night with our kids, who are 8 and 13. Most of the games we own "
             "are either too babyish or way too long. Any suggestions?"),
        assistant("That age gap is tricky, but plenty of games work for both. Look for games that take 20 to 45 "
                  "minutes and mix luck with simple choices, so the younger one can still win. Cooperative "
                  "games, where everyone plays together against the game, are great because nobody ends the "
                  "evening feeling beaten by a sibling."),
        user("The 13-year-old thinks cooperative games are boring and wants something competitive with a bit "
             "of strategy. What would keep both of them happy?"),
    ],
]

# ---------------------------------------------------------------------------------------------
# code: snippets to fix, explain or refactor, and tasks written from scratch
# ---------------------------------------------------------------------------------------------

CODE = [
    '''This function is supposed to compute the fee for our parking garage, but customers who stay exactly 30 minutes are being charged, and the daily maximum never seems to apply:

```python
import math


def parking_fee(minutes, is_weekend=False):
    FREE_MINUTES = 30
    RATE_PER_HOUR = 2.5
    DAILY_MAX = 18.0

    if minutes < FREE_MINUTES:
        return 0.0

    hours = math.ceil(minutes / 60)
    fee = hours * RATE_PER_HOUR
    if is_weekend:
        fee = fee * 1.2

    if fee > DAILY_MAX:
        fee == DAILY_MAX

    return round(fee, 2)
```

Find both bugs, explain each one in a sentence, and return the corrected function. Keep the weekend surcharge as it is.''',

    '''Write a Python function `parse_duration(text: str) -> int` that converts strings like "2h15m", "45s" or "1h5m30s" into a total number of seconds. It should raise a ValueError with a helpful message for input such as "5x" or an empty string. Use the `re` module and show four example calls with their results.''',

    '''Can you explain what this JavaScript function does, line by line? I think it has an off-by-one problem, because every page seems to show one item fewer than it should.

```javascript
function paginate(items, pageSize, pageNumber) {
  const totalPages = Math.ceil(items.length / pageSize);
  if (pageNumber < 1 || pageNumber > totalPages) {
    return { page: [], totalPages };
  }
  const start = (pageNumber - 1) * pageSize;
  const end = start + pageSize - 1;
  return {
    page: items.slice(start, end),
    totalPages,
    hasNext: pageNumber < totalPages,
  };
}
```

After the explanation, give the fixed version and one example call with an array of 7 items and a page size of 3.''',

    '''Write a Python function `longest_streak(dates)` that takes a list of `datetime.date` objects, possibly unsorted and with duplicates, and returns the length of the longest run of consecutive days. For example, the dates March 1, 2, 3, 5 and 6 should give 3. Add a docstring, and make sure an empty list returns 0.''',

    '''I wrote this small class to scale recipes up or down:

```python
class Recipe:
    def __init__(self, name, servings, ingredients):
        self.name = name
        self.servings = servings
        self.ingredients = ingredients  # dict: ingredient -> grams

    def scaled(self, new_servings):
        factor = new_servings / self.servings
        new_ingredients = {}
        for item, grams in self.ingredients.items():
            new_ingredients[item] = round(grams * factor, 1)
        return Recipe(self.name, new_servings, new_ingredients)

    def total_weight(self):
        return sum(self.ingredients.values())
```

Please turn it into a frozen dataclass with type hints, make `scaled` raise a ValueError when `new_servings` is not positive, and write three pytest tests for it. Return the complete code.''',

    '''Our clinic uses this query to find patients who missed more than two appointments this year:

```sql
SELECT p.id, p.first_name, p.last_name, COUNT(*) AS missed
FROM patients p
JOIN appointments a ON a.patient_id = p.id
WHERE a.status = 'no_show'
  AND a.scheduled_at >= '2024-01-01'
GROUP BY p.id, p.first_name, p.last_name
HAVING COUNT(*) > 2
ORDER BY missed DESC;
```

Explain what each clause does. Then rewrite it with a common table expression so that the result also shows each patient's total number of appointments this year next to the missed count.''',
]

# ---------------------------------------------------------------------------------------------
# summarization: a passage of a few hundred words plus an instruction (before or after it)
# ---------------------------------------------------------------------------------------------

SUMMARIZATION = [
    '''Summarize this news article in three sentences.

Residents of Brackenford will be able to rent electric cargo bikes from six stations around the town starting next month, after the council approved a two-year trial on Wednesday evening. The vote passed seven to two following a debate that lasted more than three hours.

The scheme, run by a local cooperative called Pedal Freight, will offer 30 bikes with large front boxes that can carry up to 80 kilograms of shopping, children or tools. Rentals will cost 3 dollars for the first half hour and 1 dollar for every 15 minutes after that, with a discounted annual pass for 90 dollars. Stations will be placed near the market square, the train station, two supermarkets, the sports center and the hospital.

Council member Ruth Adeyemi, who proposed the trial, said the bikes could replace many short car trips. According to a survey the council ran last year, almost half of all car journeys in Brackenford are shorter than three kilometers. "If even a small share of those trips move to bikes, we will see less traffic around the schools in the morning," she said.

The two members who voted against the plan raised concerns about cost and safety. The trial will cost the town 210,000 dollars, partly covered by a regional climate grant, and several shop owners worry that bikes parked on narrow pavements will block pedestrians. The cooperative has promised to train riders for free and to collect usage data, which the council will review after twelve months before deciding whether to continue.''',

    '''In the forests of Alaska and Canada lives a small brown frog with an unusual winter strategy: it freezes solid. When temperatures drop, the wood frog does not dig deep into the mud like many other frogs. Instead, it hides under a thin layer of fallen leaves and lets the cold take over.

As ice crystals begin to form on its skin, the frog's liver starts turning stored starch into glucose at high speed. Within hours, the sugar level in its blood rises to many times the normal amount. The glucose spreads into the cells and acts like antifreeze, keeping the water inside them from turning into sharp crystals that would tear the cell walls. Ice forms only in the spaces between cells and in the body cavity.

In this state, about two thirds of the water in the frog's body can be frozen. Its heart stops beating, it stops breathing, and there is no measurable brain activity. To an observer, the frog looks dead. It can stay like this for weeks, and in the coldest regions it may spend more than half the year frozen.

When spring arrives, the frog thaws from the inside out. Its heart starts beating again, often within an hour, and soon afterward it begins to breathe. After a day or so it is hopping toward the nearest pond to breed.

Researchers study wood frogs because the same tricks might one day help doctors store human organs for transplants. Today, donor organs last only hours outside the body, and learning how to freeze tissue without damaging it could save many lives.

Explain the main points of this article in four bullet points for a general audience.''',

    '''Summarize these meeting notes in five bullet points: the opening date, the budget situation, the open problems, and who owns each action.

Meeting notes – Exhibition committee, Harwell Estuary Museum, Thursday, February 6
Present: Ines Duarte (curator), Oliver Grant (facilities), Mei Tanaka (education), Samir Haddad (finance), Clara Voss (marketing)

1. Opening date. The new exhibition, "Ropes, Rivets and Rain: Shipbuilding on the Harwell Estuary", is still planned to open on May 17. Ines confirmed that 41 of the 46 objects have arrived. The remaining five, including the large ship model from the Delmont collection, are expected by the end of March.

2. Budget. Samir reported that the project is 12,000 dollars over its budget of 95,000, mainly because the display cases cost more than quoted. The committee agreed to drop the planned audio guide and use printed labels with QR codes instead, which saves about 9,000 dollars. Samir will ask the Friends of the Museum whether they can cover the rest.

3. Building work. Oliver said the floor in Gallery 2 must be reinforced before the ship model can be installed. The contractor can only start on April 8, which leaves little room for delays. Oliver will ask for a written guarantee of the finish date.

4. Schools program. Mei presented three workshops for children aged 8 to 12, including one where students build small boats and test them in a water tank. Schools can book from March 1.

5. Promotion. Clara will launch the poster campaign on April 20 and invite the local press to a preview evening on May 15.

Next meeting: March 6.''',

    '''I bought the Tidyro S6 robot vacuum in January for our two-bedroom flat, which has wooden floors, one thick rug and a shedding husky named Juno. After two months of daily use, here is my honest opinion.

Cleaning performance on hard floors is excellent. It picks up dog hair, crumbs and the grit we bring in from the street, and the side brush reaches well into corners. On the thick rug it is less impressive: it gets the hair on the surface but leaves sand deep in the pile, so I still run our old upright vacuum over it once a week.

The mapping feature works better than I expected. After its first run it had drawn an accurate floor plan, and in the app I can mark no-go zones, such as the area around Juno's water bowl, which it used to tip over. Scheduling is simple, and it runs every morning at ten while we are at work.

There are annoyances. The dustbin is small and fills up in two days because of the dog hair. The robot also gets stuck on the metal base of our bar stools about once a week and sends a sad notification to my phone. The app asked me to create an account and accept marketing emails before I could use it, which I did not love.

At 349 dollars it is not cheap, but it has saved me around three hours of vacuuming a week. For pet owners with mostly hard floors, I would buy it again. If your home is mostly carpet, look elsewhere.

Please summarize this review in three or four sentences, and say whether the reviewer recommends the product and for whom.''',

    '''Retell this short story in three or four sentences: who are the main characters, and how does it end?

Every Friday evening, Mr. Okonjo set up his dumpling stall at the far end of the night market, between the man who sold phone cases and the woman who sold grilled corn. He had made the same pork and cabbage dumplings for nineteen years, and he knew most of his customers by the way they said hello.

One Friday in late November, a boy of about seven appeared at the edge of his table. He wore a yellow raincoat and held a paper lantern shaped like a fish. He did not say hello. He only watched the steam rise from the bamboo baskets.

"Are you lost?" Mr. Okonjo asked. The boy nodded. His name was Teo, he said, and he had been holding his sister's hand until a crowd of people pushed between them near the music stage.

Mr. Okonjo gave him a dumpling, then another, and asked the corn seller to watch his stall. Holding Teo's free hand, he walked slowly through the market, asking at every stall. Nobody had seen a worried girl. The musicians stopped between songs so that Mr. Okonjo could borrow their microphone. "There is a boy here with a fish lantern," he said. "He is looking for his sister."

Two minutes later, a teenage girl came running through the crowd, crying and laughing at the same time. Her name was Lina, and she had been searching for almost an hour.

The following Friday, the two of them came back with their mother. They ordered twelve dumplings and left a drawing on the counter: a yellow raincoat, a fish lantern, and a very tall man holding a steaming basket.''',

    '''Summarize this history article in four bullet points, one for each period of the observatory's history.

The Kestrel Ridge Observatory sits at 2,150 meters on the highest ridge of the Orrin Mountains, and for more than a century it has watched the sky through some of the clearest air in the region. Its story began in 1907, when the astronomer Helena Marsh persuaded a wealthy textile family to pay for a small telescope far away from the smoke of the industrial towns in the valley.

Building the first dome took three summers. Every brick, beam and glass plate had to be carried up a narrow mule track, and the telescope's mirror was wrapped in wool and brought up by six men on a wooden frame. The observatory opened in 1911 with a staff of two, who lived on the ridge from April to October and spent the winters in the town of Lowmere.

Between the 1920s and the 1950s, Kestrel Ridge became known for its careful records of variable stars, whose brightness changes over days or weeks. Its observers published more than 40,000 measurements, many of which are still used today. A road reached the ridge in 1936, and a larger telescope arrived in 1952.

By the 1980s, light from the growing towns below had made the night sky noticeably brighter, and serious research moved to newer observatories abroad. The site nearly closed in 1991. Instead, a group of amateur astronomers formed a trust, restored both telescopes and opened the observatory to the public. Today about 15,000 visitors a year come for night tours, and the ridge has been declared a protected dark-sky area.''',
]

# ---------------------------------------------------------------------------------------------
# rag_qa: [Doc n] documents and a question to be answered from them
# ---------------------------------------------------------------------------------------------

RAG_QA = [
    '''[Doc 1] House Rules – Linden Court Apartments, Section 2: Bicycles and Storage. Residents may keep bicycles only in the locked bike room in the basement, which opens with the same key fob as the main entrance. Each apartment may store at most two bicycles there. Bicycles must carry a sticker with the apartment number, available free from the building office. Cargo bikes and electric scooters are not allowed in the bike room because of limited space and fire safety rules.

[Doc 2] Section 3: Quiet Hours and Noise. Quiet hours are from 22:00 to 7:00 on weekdays and from 23:00 to 9:00 on Fridays and Saturdays. During these times, residents should avoid loud music, power tools and moving furniture. Renovation work that causes noise, such as drilling, is permitted only between 8:00 and 18:00 on weekdays and must be announced to neighbors on the notice board at least three days in advance.

[Doc 3] Section 5: Guests and Parking. Guests may park in the four visitor spaces marked with a green V for up to 48 hours. For longer stays, the resident must request a temporary permit from the building office, which costs 5 dollars per day and is limited to 14 days per month. Cars parked in resident spaces without a permit will be towed at the owner's expense.

Question: My brother is staying with me for a week and is bringing his car and his electric scooter. Where can he park the car, what will it cost, and can the scooter go in the bike room?
Answer from the documents only, quoting the sentences that support each part of your answer.''',

    '''[Doc 1] Returns – Oakhaven Furniture. Unused items in their original packaging can be returned within 30 days of delivery for a full refund. Items that have been assembled can be returned within 14 days, but a 15 percent restocking fee applies. Mattresses may be returned within 100 nights if a hygiene cover was used, and only one mattress return is allowed per customer. Made-to-order sofas and items bought in the clearance section cannot be returned.

[Doc 2] Delivery and Collection. Standard delivery costs 49 dollars and is free for orders over 800 dollars. When an item is returned, Oakhaven collects it from the customer's home for a fee of 39 dollars, which is deducted from the refund. Customers may instead bring the item back to any store at no cost. Refunds are paid to the original payment method within 10 working days after the item has been inspected.

[Doc 3] Warranty. All furniture carries a two-year warranty against manufacturing defects, such as broken frames, faulty drawer runners, or seams that come apart under normal use. The warranty does not cover damage caused by pets, sunlight or incorrect assembly. To make a claim, customers should send photos of the defect and their order number to the customer service team, who will arrange a repair or a replacement.

Question: Three weeks ago I received a bookshelf that I assembled myself, and now one of the shelves has split along the glue line. Should I return it or use the warranty, and what would each option cost me?
Use only the information in these documents and cite them as [Doc n] after each statement.''',

    '''[Doc 1] Course Registration – Department of Environmental Science, Autumn Term. Registration for autumn courses opens on August 5 at 9:00 and closes on September 13. Students register through the student portal. Each course has a fixed number of places, and once a course is full, students can join its waiting list. Places that become free are offered to students on the waiting list in order, and an offer must be accepted within 48 hours or it passes to the next student.

[Doc 2] Prerequisites. ENV 310 Soil Chemistry requires a pass in ENV 210 Environmental Chemistry or an equivalent course from another university. Students who took an equivalent course elsewhere must upload its course description and their transcript to the portal, and the course coordinator decides within five working days. ENV 320 Field Methods has no prerequisites but requires attendance at a one-day safety briefing before the first field trip.

[Doc 3] Late Changes. After registration closes, students may add a course until September 27, but only with written permission from the course coordinator and only if places are available. Courses dropped before October 4 do not appear on the transcript. Courses dropped after October 4 are recorded as "Withdrawn" and still count toward the tuition fee.

Question: I transferred from another university, where I took an environmental chemistry course, and I want to take ENV 310 this autumn. Today is September 20 and I haven't registered yet. Is it still possible, and what do I need to do?
Answer using only these documents. Quote the exact sentences you rely on, and say clearly if something cannot be determined from them.''',

    '''[Doc 1] VoltNest Smart Plug – Quick Start Guide, Section 2: Setup. Plug the device into a wall socket and wait until the ring light blinks blue quickly, about twice per second. Open the VoltNest app, tap Add Device, and select Smart Plug. The plug only works with 2.4 GHz Wi-Fi networks; 5 GHz networks are not supported. If your router uses one name for both bands, you may need to enable a separate 2.4 GHz network in the router settings.

[Doc 2] Section 3: Light Signals. A steady blue light means the plug is connected and the outlet is switched on. No light means the outlet is switched off. A slowly blinking blue light, about once every two seconds, means the plug has lost its Wi-Fi connection and is trying to reconnect. A red light means the plug has switched itself off because the connected device drew more than 16 amperes.

[Doc 3] Section 5: Factory Reset. To reset the plug, press and hold the side button for 8 seconds until the ring light turns red and then blinks blue quickly. All schedules and timers stored on the plug will be deleted. After a reset, the plug must be added to the app again as described in Section 2.

Question: Since I changed my home Wi-Fi password, the light on my smart plug has been blinking blue slowly for a whole day, and the timer that switches on my evening lamp has stopped working. How do I fix this, and will I lose my timer?
Answer strictly from the documents, quoting each sentence you rely on.''',

    '''[Doc 1] Beavers disappeared from the Ellery River catchment in the early 1800s, when they were hunted for their fur and for a gland used in perfume. For nearly two hundred years the river was managed mainly for farming, and many of its side streams were straightened into ditches to drain the surrounding fields. By 2000, summer floods in the village of Thornwick had become a regular problem, damaging homes in 2007, 2012 and 2016.

[Doc 2] In 2017 the Ellery Rivers Trust released four beaver families into a fenced area of woodland on the upper Ellery, about eleven kilometers upstream from Thornwick. Within three years the beavers had built thirteen dams, creating a chain of ponds that hold back water during heavy rain. The trust's monitoring found that peak flows during storms were about 30 percent lower below the beaver site than before the release.

[Doc 3] Not all landowners welcomed the beavers. Two farmers downstream reported that beaver dams had flooded parts of their fields in the wet winter of 2020, and one lost a small orchard when the animals felled several fruit trees. In response, the trust installed pipes through some of the dams to control water levels and agreed to pay compensation for crop losses. Thornwick had no serious flooding between 2017 and 2023.

Question: Did bringing back the beavers reduce flooding in Thornwick, and what problems did it cause? Give the numbers that the documents mention.
Answer only from the documents and say which document supports each point.''',

    '''[Doc 1] Backcountry Camping Permits – Silverpine National Park. A permit is required for all overnight stays outside the park's two campgrounds. Permits can be reserved online from March 1 for trips between May 15 and October 15, and each permit covers a group of up to six people. The permit costs 10 dollars per trip plus 4 dollars per person per night. Walk-in permits are issued at the Aspen Gate visitor center on the day before or the day of the trip, if places remain.

[Doc 2] Campfires and Food Storage. Campfires are allowed only in the metal fire rings at designated backcountry sites, and they are banned entirely whenever the fire danger level is high or extreme. Portable gas stoves may be used at any time. All food, trash and scented items such as toothpaste must be stored in a bear-resistant container, which visitors can borrow free of charge at the visitor center against a 50-dollar deposit.

[Doc 3] Dogs. Dogs are allowed on the Lakeshore Trail and in both campgrounds, but not on other backcountry trails or at backcountry sites. Dogs must be kept on a lead no longer than two meters at all times.

Question: Four of us want to spend two nights at a backcountry site in July, and we would like to bring our dog and cook over a campfire. How much will the permit cost, and are the dog and the campfire allowed?
Base your answer only on the documents and quote the sentences you use.''',
]

# ---------------------------------------------------------------------------------------------
# qa: open questions (no input to copy from)
# ---------------------------------------------------------------------------------------------

QA = [
    "Why do astronauts on the International Space Station float, even though Earth's gravity is still strong "
    "at that height?",
    "What is the difference between a simile and a metaphor? Give one example of each.",
    "How do salmon find their way back to the river where they hatched?",
    "Why did the Roman Empire eventually split into an eastern and a western half?",
    "What does a router do in a home network, and how is it different from a modem?",
    "How does a pressure cooker cook food so much faster than an ordinary pot?",
]

# ---------------------------------------------------------------------------------------------
# math: word problems and exercises
# ---------------------------------------------------------------------------------------------

MATH = [
    "How many liters of a drink that is 20% fruit juice must be mixed with 10 liters of a drink that is 50% fruit "
    "juice to get a mixture that is 30% juice? Set up an equation and solve it.",
    "In Ms. Ferreira's class, tests count for 60% of the final grade, homework for 25% and a project for 15%. "
    "Jonah scored 72 on tests, 90 on homework and 84 on the project. What is his final grade, and what test "
    "score would he have needed for a final grade of 80? Show your work.",
    "A triangular plot of land has sides of 13 m, 14 m and 15 m. Use Heron's formula to find its area, and "
    "explain each step.",
    "A café makes sandwiches from 4 kinds of bread, 5 fillings and 3 sauces. Each sandwich has one bread, two "
    "different fillings and one sauce. How many different sandwiches are possible? Explain how you counted.",
    "A flight leaves Dublin at 22:40 local time and lands in Toronto 7 hours and 55 minutes later. Toronto is "
    "5 hours behind Dublin. What is the local time in Toronto when the plane lands? Walk me through it.",
    "A sheet of paper is 0.1 mm thick. If you could fold it in half 10 times, how thick would the stack be?",
]

# ---------------------------------------------------------------------------------------------
# rewrite: messy or formal texts to correct, formalise, simplify, restructure or translate
# ---------------------------------------------------------------------------------------------

REWRITE = [
    '''Correct the spelling and grammar in this email to a print shop. Keep it polite, keep every detail, and reply with the corrected email only.

hello, my name is Priyanka Das and i ordered 120 wedding invitations from you on the 2nd of may, order number 55812. they was delivered yesterday but their is two mistake. first the date of the wedding is printed as 14 june but it should be 21 june, i checked the proof i approved and it say 21 so i think the mistake happen on your side. second the cards is suppose to be cream color but they are bright white. we need to send the invitations before the end of this month so we dont have much time. could you please reprint them and tell me when they will be ready? i can come pick them up at the shop if its faster. thank you, Priyanka''',

    '''Rewrite this chat message as a formal notice to all customers of our web hosting service. Keep every date, time and technical detail.

ok so heads up everyone, we're moving the database servers to the new data center this weekend. downtime should be sat the 9th from 1am to like 5am (UTC), maybe less if nothing explodes haha. during that window the control panel and email will be down, but the websites themselves should stay up bc they're on the other cluster. if anyone has a big launch or sale planned that night pls tell them to reschedule or at least let us know by thursday so we can keep an eye on their site. backups are already done so no data should be lost. any questions -> support team or just reply to this ticket. cheers, Marek (infrastructure)''',

    '''Translate this paragraph into Italian, using simple everyday language.

On Saturday mornings I go to the rowing club by the river. I usually arrive at half past seven, when the water is still calm and there are not many people around. We row in a boat for four people, and our coach follows us in a small motorboat and shouts advice. It is hard work, especially in winter when my hands get cold, but I always feel better afterwards. After training, we eat breakfast together in the clubhouse and talk about the week. In June we will take part in our first race in another city, and I am already a little nervous.''',

    '''This is a transcript of a voice memo my grandfather recorded about his lentil soup. Turn it into a clear recipe with an ingredient list and numbered steps, keeping all of his amounts and times.

right so the soup, you start with one big onion and two carrots, chop them small, not too small, and two cloves of garlic. put a good glug of olive oil in the big pot, maybe three spoons, and cook the onion first for about five minutes till it's soft, then the carrots and garlic for another three or so. oh and a teaspoon of cumin, that goes in with the garlic. then 250 grams of red lentils, rinse them first, always rinse them, and one and a half liters of stock. let it bubble gently for twenty five minutes and stir now and then so it doesn't stick. at the end squeeze in half a lemon and salt to taste. your grandmother liked it blended smooth but i like it chunky, so that's up to you.''',

    '''Rewrite this paragraph from my home insurance policy in plain English that a teenager could understand. Don't leave out any condition or amount.

Notwithstanding any other provision of this policy, the insurer shall not be liable for loss of or damage to property occasioned by the escape of water from any fixed domestic water installation where the insured premises have been left unoccupied for a period exceeding 30 consecutive days, unless the main water supply has been turned off at the stopcock and all water tanks and pipes have been drained. In respect of any claim for water damage that is accepted, the policyholder shall bear the first 350 pounds of each and every claim, such amount being in addition to any other excess applicable under this policy.''',

    '''Coral reefs covers less than one percent of the ocean floor, but they are home for about a quarter of all sea species. A reef are built by tiny animals called polyps, which makes hard skeletons out of calcium from the seawater. Over thousands of year, this skeletons pile up and forms huge structures, like the Great Barrier Reef in Australia who is so big it can be seen from space. Corals gets there bright colors from small algae that lives inside them and gives them food. When the water become to warm, the corals pushes out the algae and turns white, this is called bleaching. If the water dont cool down soon, the coral can die. Scientist says that protecting reefs are important for fishing, tourism and for protect coasts from storms.

Please correct the grammar and spelling in this paragraph from my biology homework, then list the three most important corrections with a short explanation of each.''',
]


def _single_turn(texts: list) -> list:
    return [[user(t)] for t in texts]


PROMPTS = {
    "multi_turn": MULTI_TURN,
    "code": _single_turn(CODE),
    "summarization": _single_turn(SUMMARIZATION),
    "rag_qa": _single_turn(RAG_QA),
    "qa": _single_turn(QA),
    "math": _single_turn(MATH),
    "rewrite": _single_turn(REWRITE),
}


def build() -> dict:
    """The held-out set in the file's schema; the same output on every run (no randomness)."""
    assert tuple(PROMPTS) == CATEGORIES
    categories = {}
    for name in CATEGORIES:
        chats = PROMPTS[name]
        assert len(chats) == PER_CATEGORY, f"{name}: {len(chats)} prompts, expected {PER_CATEGORY}"
        assert len({json.dumps(c) for c in chats}) == len(chats), f"duplicate prompts in {name}"
        categories[name] = [{"id": f"heldout-{name}-{k:02d}", "messages": m} for k, m in enumerate(chats, 1)]
    return {
        "version": 1,
        "description": ("Held-out benchmark prompts in the seven workload categories of workloads.json, 6 per "
                        "category. Nothing is tuned on them (default K, tree shapes, the per-prompt router) and "
                        "no drafter is trained on them, and they share no text with workloads.json or "
                        "train_prompts.json; results on them are reported separately as held-out figures. "
                        "Generated by make_heldout_prompts.py."),
        "categories": categories,
    }


def render(data: dict) -> str:
    return json.dumps(data, ensure_ascii=False, indent=1) + "\n"


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    text = render(build())
    if "--check" in argv:
        current = OUT_PATH.read_text(encoding="utf-8") if OUT_PATH.exists() else None
        if current != text:
            print(f"{OUT_PATH} is stale; rerun without --check")
            return 1
        print(f"{OUT_PATH} is up to date")
        return 0
    OUT_PATH.write_text(text, encoding="utf-8")
    counts = {k: len(v) for k, v in json.loads(text)["categories"].items()}
    print(f"wrote {OUT_PATH}: {sum(counts.values())} prompts {counts}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
